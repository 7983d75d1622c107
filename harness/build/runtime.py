"""The node's container runtime from the Go module proxy at pinned versions:
containerd (+ctr, containerd-shim-runc-v2), runc, the CNI plugins, crictl,
and the image registry (distribution) nodes pull the e2e images from.

Each is ``GOBIN=... go install pkg@version``: the module's own go.mod, checked
against the sum database. Output goes to $KUBE_HARNESS_CACHE/<name>/
<version>-<hash12>/bin, keyed by version, packages, tags, flags, Go version
(and for runc libseccomp and gcc); the completion marker is written last, so
a cached call only looks at files (no go run).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Callable

from ..progress import phase
from .cache import BuildError, cache_dir, digest, file_digest, log, produce, run
from .kube import go_version

RUNTIME_VERSIONS = {"containerd": "v2.4.2", "runc": "v1.5.3", "cni-plugins": "v1.9.0"}
REGISTRY_VERSION = "v3.0.0"  # github.com/distribution/distribution/v3
ACTIONLINT_VERSION = "v1.7.12"  # github.com/rhysd/actionlint (checks .github/ and action.yml)
CNI_PLUGINS = ("main/loopback", "main/bridge", "main/ptp", "ipam/host-local", "meta/portmap", "meta/bandwidth",
               "meta/tuning", "meta/firewall")
# one go install: (packages in the module, "" for its root; build tags; ldflags; cgo)
Step = tuple[tuple[str, ...], str, str, bool]


def build_containerd() -> Path:
    v = RUNTIME_VERSIONS["containerd"]
    mod = "github.com/containerd/containerd/v2"
    ld = f"-s -w -X {mod}/version.Version={v}"
    steps = [(("cmd/containerd", "cmd/ctr"), "urfave_cli_no_docs", ld, False),
             (("cmd/containerd-shim-runc-v2",), "urfave_cli_no_docs no_grpc", ld, False)]

    def check(b: Path) -> None:
        check_binary(b / "containerd", ["--version"], f" {v}")
        check_binary(b / "ctr", ["--version"], f" {v}")
        check_binary(b / "containerd-shim-runc-v2", ["-v"], f" {v}")
    return go_install("containerd", mod, v, steps, check)


def build_runc() -> Path:
    """runc with seccomp (cgo), static when libseccomp.a is there (as ``make static``)."""
    v = RUNTIME_VERSIONS["runc"]
    static = _libseccomp_static()
    tags, ld = "seccomp urfave_cli_no_docs", "-s -w"
    if static:
        tags, ld = tags + " netgo osusergo", ld + " -extldflags -static"
    else:
        log.warning("libseccomp.a not found: building runc dynamically linked", extra={"phase": "build-runc"})

    def check(b: Path) -> None:
        check_binary(b / "runc", ["--version"], f"runc version {v.lstrip('v')}", static=static)
    return go_install("runc", "github.com/opencontainers/runc", v, [(("",), tags, ld, True)], check,
                    extra=[static, _cmd_out(["pkg-config", "--modversion", "libseccomp"]),
                           _cmd_out(["gcc", "--version"]).splitlines()[0]])


def build_cni_plugins() -> Path:
    v = RUNTIME_VERSIONS["cni-plugins"]
    mod = "github.com/containernetworking/plugins"
    ld = f"-s -w -X {mod}/pkg/utils/buildversion.BuildVersion={v}"

    def check(b: Path) -> None:
        for p in CNI_PLUGINS:
            name = p.rsplit("/", 1)[1]
            check_binary(b / name, [], '"supportedVersions"', env={"CNI_COMMAND": "VERSION"})
            check_binary(b / name, [], f"CNI {name} plugin {v}", env={})
    return go_install("cni-plugins", mod, v, [(tuple(f"plugins/{p}" for p in CNI_PLUGINS), "", ld, False)], check)


def build_crictl(version: str) -> Path:
    if not re.match(r"^v\d+\.\d+\.\d+$", version):
        raise BuildError(f"crictl version {version!r}; allowed: vMAJOR.MINOR.PATCH, e.g. v1.37.0")
    mod = "sigs.k8s.io/cri-tools"
    ld = f"-s -w -X {mod}/pkg/version.Version={version}"

    def check(b: Path) -> None:
        check_binary(b / "crictl", ["--version"], f"crictl version {version}")
    return go_install("crictl", mod, version, [(("cmd/crictl",), "", ld, False)], check)


def build_registry() -> Path:
    """The OCI distribution registry (bin/registry), static."""
    v, mod = REGISTRY_VERSION, "github.com/distribution/distribution/v3"
    ld = f"-s -w -X {mod}/version.version={v}"

    def check(b: Path) -> None:
        check_binary(b / "registry", ["--version"], v)
    return go_install("registry", mod, v, [(("cmd/registry",), "", ld, False)], check)


def build_actionlint() -> Path:
    """actionlint (bin/actionlint), the GitHub Actions workflow checker the CI files' test runs."""
    v, mod = ACTIONLINT_VERSION, "github.com/rhysd/actionlint"

    def check(b: Path) -> None:
        check_binary(b / "actionlint", ["-version"], v.lstrip("v"))
    return go_install("actionlint", mod, v, [(("cmd/actionlint",), "", f"-s -w -X {mod}.version={v}", False)], check)


def build_runtime() -> dict[str, Path]:
    return {"containerd": build_containerd(), "runc": build_runc(), "cni-plugins": build_cni_plugins()}


def is_static(path: Path) -> bool:
    """True if the ELF executable has no PT_INTERP (needs no dynamic loader)."""
    with open(path, "rb") as f:
        h = f.read(64)
        if h[:4] != b"\x7fELF" or h[4] != 2:
            raise BuildError(f"{path}: not a 64-bit ELF file")
        e = "<" if h[5] == 1 else ">"
        (phoff,), (phentsize, phnum) = struct.unpack_from(e + "Q", h, 32), struct.unpack_from(e + "HH", h, 54)
        f.seek(phoff)
        ph = f.read(phentsize * phnum)
    return all(struct.unpack_from(e + "I", ph, i * phentsize)[0] != 3 for i in range(phnum))  # 3: PT_INTERP


def go_install(name: str, mod: str, version: str, steps: list[Step], check: Callable[[Path], None],
               extra: list | None = None) -> Path:
    """``go install mod/pkg@version`` for each step (packages, tags, ldflags,
    cgo) into the cached bin dir ``$KUBE_HARNESS_CACHE/<name>/<version>-<hash12>``,
    then ``check(bin_dir)``; a cache hit looks at files only."""
    key = digest("runtime-v1", name, mod, version, steps, extra or [], _go_version())

    def build(tmp: Path) -> dict:
        (tmp / "bin").mkdir()
        with phase(f"build-{name}", machine=version):
            sum_ = json.loads(run(["go", "mod", "download", "-json", f"{mod}@{version}"], cwd=tmp,
                                  env=_env(False), what=f"go mod download {mod}@{version}"))["Sum"]
            for pkgs, tags, ld, cgo in steps:
                run(["go", "install", "-trimpath", "-tags", tags, "-ldflags", ld,
                     *[f"{mod}{'/' + p if p else ''}@{version}" for p in pkgs]],
                    cwd=tmp, env={**_env(cgo), "GOBIN": str(tmp / "bin")}, what=f"go install {name} {version}")
            check(tmp / "bin")
        sha = {b.name: file_digest(b) for b in sorted((tmp / "bin").iterdir())}
        return {"version": version, "module": mod, "sum": sum_, "go": _go_version(), "sha256": sha}
    return produce(cache_dir() / name / f"{version}-{key[:12]}", build)


def check_binary(path: Path, args: list[str], expect: str, *, static: bool = True, env: dict | None = None) -> None:
    if not path.is_file():
        raise BuildError(f"{path} missing")
    if static and not is_static(path):
        raise BuildError(f"{path} is dynamically linked, expected static")
    p = subprocess.run([str(path), *args], capture_output=True, text=True, timeout=60,
                       env=None if env is None else {"PATH": os.environ.get("PATH", ""), **env})
    if expect not in p.stdout + p.stderr:
        raise BuildError(f"{path.name} {' '.join(args)}: {expect!r} not in its output {(p.stdout + p.stderr)[:300]!r}")


def _env(cgo: bool) -> dict[str, str]:
    """os.environ without settings that change what is built; the module's go line picks the toolchain."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CGO_", "GOOS", "GOARCH", "GOAMD64", "GOEXPERIMENT", "GOFLAGS", "GOBIN"))}
    return {**env, "CGO_ENABLED": "1" if cgo else "0", "GOFLAGS": "-buildvcs=false", "GOTOOLCHAIN": "auto"}


def _go_version() -> str:
    """``go env GOVERSION`` of the local Go, from GOROOT/VERSION when there (no go run on cache hits)."""
    go = shutil.which("go")
    f = Path(go).resolve().parents[1] / "VERSION" if go else None
    if f and f.is_file() and f.read_text().startswith("go"):
        return f.read_text().split()[0]
    return go_version()


def _cmd_out(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        raise BuildError(f"{cmd[0]} failed: runc needs gcc, pkg-config and libseccomp-dev "
                         "(apt-get install gcc pkg-config libseccomp-dev)") from None


def _libseccomp_static() -> bool:
    libdir = _cmd_out(["pkg-config", "--variable=libdir", "libseccomp"])
    return (Path(libdir) / "libseccomp.a").is_file()
