"""etcd, CoreDNS and pause binaries at the versions kubeadm asks for.

etcd and CoreDNS come from their own Go modules (harness/build/sources/etcd-build,
coredns-build) at their pinned versions; another version gets a module
generated into the cache. pause is Kubernetes' own build/pause/linux/pause.c
from the k8s.io/kubernetes module, compiled static.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from ..progress import phase
from .cache import BuildError, cache_dir, digest, go_module, is_complete, lock, log, mark_complete, produce, run, source
from .kube import go_env, go_version

MODULES = {
    "etcd": {"dir": "etcd-build", "modules": ["go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/etcdctl/v3"],
             "bins": {"etcd": "go.etcd.io/etcd/server/v3", "etcdctl": "go.etcd.io/etcd/etcdctl/v3"}},
    "coredns": {"dir": "coredns-build", "modules": ["github.com/coredns/coredns"],
                "bins": {"coredns": "github.com/coredns/coredns"}},
}


def pinned_version(name: str) -> str:
    spec = MODULES[name]
    m = re.search(rf"^\s*(?:require\s+)?{re.escape(spec['modules'][0])} (v\S+)",
                  (source(spec["dir"]) / "go.mod").read_text(), re.M)
    if not m:
        raise BuildError(f"{source(spec['dir'])}/go.mod does not pin {spec['modules'][0]}")
    return m.group(1)


def _module(name: str, version: str) -> Path:
    spec = MODULES[name]
    if version == pinned_version(name):
        return go_module(spec["dir"])
    d = cache_dir() / f"{name}-src" / version
    if is_complete(d):
        return d
    with lock(f"{name}-src-{version}"):
        d.mkdir(parents=True, exist_ok=True)
        req = "\n".join(f"\t{m} {version}" for m in spec["modules"])
        (d / "go.mod").write_text(f"module {name}build\n\ngo 1.24\n\nrequire (\n{req}\n)\n")
        imports = "\n".join(f'\t_ "{m}"' for m in spec["modules"])
        (d / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n")
        run(["go", "mod", "tidy"], cwd=d, env=go_env(), what=f"go mod tidy {name} {version}")
        mark_complete(d, {"version": version})
    return d


def build_go_component(name: str, version: str) -> Path:
    """bin dir with the component's binaries (etcd+etcdctl, or coredns)."""
    if name not in MODULES:
        raise BuildError(f"component {name!r}; allowed: {sorted(MODULES)}")
    if not re.match(r"^v\d+\.\d+\.\d+$", version):
        raise BuildError(f"{name} version {version!r}; allowed: vMAJOR.MINOR.PATCH")
    mod = _module(name, version)
    key = digest(f"{name}-v1", version, mod / "go.mod", mod / "go.sum", go_version())

    def build(tmp: Path) -> dict:
        (tmp / "bin").mkdir()
        with phase(f"build-{name}", machine=version):
            for binary, pkg in MODULES[name]["bins"].items():
                run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(tmp / "bin" / binary), pkg],
                    cwd=mod, env=go_env(), what=f"go build {binary} {version}")
        return {"version": version}
    return produce(cache_dir() / name / f"{version}-{key[:12]}", build)


def build_pause(kube_module_dir: Path, version: str) -> Path:
    """Static pause binary from the Kubernetes module's pause.c."""
    gomod = run(["go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"], cwd=kube_module_dir, env=go_env(),
                what="locate k8s.io/kubernetes").strip()
    src = Path(gomod) / "build" / "pause" / "linux" / "pause.c"
    if not src.exists():
        raise BuildError(f"{src} not found in the k8s.io/kubernetes module")
    if not shutil.which("gcc"):
        raise BuildError("gcc is needed to build pause (apt-get install gcc libc6-dev; ci/setup.sh does)")
    gcc = subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    key = digest("pause-v1", version, src.read_bytes(), gcc)

    def build(tmp: Path) -> dict:
        run(["gcc", "-Os", "-Wall", "-static", f"-DVERSION=v{version}", "-o", str(tmp / "pause"), str(src)],
            what="gcc pause")
        run(["strip", str(tmp / "pause")], what="strip pause")
        log.info(f"built pause {version}", extra={"phase": "build-pause"})
        return {"version": version}
    return produce(cache_dir() / "pause" / f"{version}-{key[:12]}", build)
