"""Kubernetes binaries built from the Go module proxy.

The packaged module ``kube-build`` (harness/build/sources/kube-build, copied
into the cache to run go in: :func:`.cache.go_module`) requires
k8s.io/kubernetes at the default version and pins
every staging module by replace. Another version gets the same module
generated into the cache from that release's own go.mod. Output is cached
under $KUBE_HARNESS_CACHE/kube/<version>-<hash12>/bin, keyed by the module
files, flags and Go version; a completion marker is written last.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from ..progress import phase
from .. import versions
from .cache import (BuildError, cache_dir, digest, file_digest, go_module, is_complete, lock, log, mark_complete,
                    produce, run, source)

#: the packaged module (read-only: go runs in :func:`pinned_module`, its copy in the cache)
KUBE_BUILD = source("kube-build")
COMMANDS = ("kubeadm", "kubelet", "kubectl", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
            "kube-proxy")
BUILD_DATE = "2026-01-01T00:00:00Z"  # fixed: reproducible binaries


def default_version() -> str:
    return versions.DEFAULT_VERSION


def pinned_version() -> str:
    """The version the kube-build module requires (tests check it is the default)."""
    m = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes (v\S+)", (KUBE_BUILD / "go.mod").read_text(), re.M)
    if not m:
        raise BuildError(f"{KUBE_BUILD}/go.mod does not require k8s.io/kubernetes")
    return m.group(1)


def check_version(version: str) -> tuple[int, int, int]:
    why = versions.problem(version)
    if why:
        raise BuildError(f"invalid Kubernetes version {version!r}; allowed: {why}")
    return versions.parse(version)


def ldflags(version: str) -> str:
    major, minor, _ = check_version(version)
    pairs = {
        "gitVersion": version, "gitMajor": str(major), "gitMinor": str(minor), "gitTreeState": "clean",
        "gitCommit": "0" * 40, "buildDate": BUILD_DATE,
    }
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {pkg}.{k}={v}" for k, v in pairs.items()]
    return " ".join(flags)


def go_env() -> dict[str, str]:
    return {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}


def go_version() -> str:
    try:
        return subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        raise BuildError(f"Go is needed to build Kubernetes ({e}); install Go >= 1.24 (ci/setup.sh does)") from None


def pinned_module() -> Path:
    """Where go runs for the pinned version: the kube-build module's copy in the cache."""
    return go_module("kube-build")


def module_dir(version: str) -> Path:
    """The Go module that builds ``version``: kube-build's copy or a generated one."""
    check_version(version)
    if version == pinned_version():
        return pinned_module()
    d = cache_dir() / "kube-src" / version
    if is_complete(d):
        return d
    with lock(f"kube-src-{version}"), phase("go-module", machine=version):
        d.mkdir(parents=True, exist_ok=True)
        tmp = Path(run(["go", "mod", "download", "-json", f"k8s.io/kubernetes@{version}"], cwd=pinned_module(),
                       env=go_env(), what="go mod download").split('"GoMod": "')[1].split('"')[0])
        staging = re.findall(r"^\s*(k8s\.io/[\w.-]+) => \./staging/", tmp.read_text(), re.M)
        if not staging:
            raise BuildError(f"k8s.io/kubernetes@{version}: no staging replaces found in its go.mod")
        _, minor, patch = check_version(version)
        go = re.search(r"^go (\S+)", tmp.read_text(), re.M)
        lines = ["module kubebuild", "", f"go {go.group(1) if go else '1.24.0'}", "",
                 f"require k8s.io/kubernetes {version}", "", "replace ("]
        lines += [f"\t{m} => {m} v0.{minor}.{patch}" for m in staging] + [")", ""]
        (d / "go.mod").write_text("\n".join(lines))
        tools = [f'\t_ "k8s.io/kubernetes/cmd/{c}"' for c in COMMANDS]
        (d / "tools.go").write_text("//go:build tools\n\npackage tools\n\nimport (\n" + "\n".join(tools) + "\n)\n")
        run(["go", "mod", "tidy"], cwd=d, env=go_env(), what="go mod tidy")
        mark_complete(d, {"version": version})
    return d


def output_dir(version: str) -> Path:
    mod = module_dir(version)
    key = digest("kube-v1", version, mod / "go.mod", mod / "go.sum", ldflags(version), go_version(), COMMANDS)
    return cache_dir() / "kube" / f"{version}-{key[:12]}"


RELEASE_DIR_ENV = "KUBE_HARNESS_RELEASE_DIR"


def build_kubernetes(version: str | None = None, *, source: str | None = None,
                     release_dir: str | Path | None = None, force: bool = False) -> Path:
    """Directory whose bin/ holds the Kubernetes commands of ``version``.

    ``source="release"`` takes official release binaries from ``release_dir``
    (for users with internet) instead of building. Without ``source``,
    $KUBE_HARNESS_RELEASE_DIR decides: set, it is the release directory
    (``{version}`` in it is replaced, e.g. ``/dl/{version}/kubernetes/server/bin``),
    so node images, upgrades and the suites all use release binaries."""
    version = default_version() if version is None else version
    check_version(version)
    if source is None:
        release_dir = release_dir or os.environ.get(RELEASE_DIR_ENV) or None
        source = "release" if release_dir else "build"
    if source == "release":
        return _from_release(version, Path(str(release_dir or "").replace("{version}", version)))
    if source != "build":
        raise BuildError(f"source {source!r}; allowed: build, release")
    out = output_dir(version)
    if is_complete(out) and not force:
        log.info(f"kubernetes {version}: cached at {out}", extra={"phase": "build-kubernetes"})
        return out
    mod = module_dir(version)

    def build(tmp: Path) -> dict:
        (tmp / "bin").mkdir()
        with phase("build-kubernetes", machine=version):
            run(["go", "build", "-trimpath", "-ldflags", ldflags(version), "-o", str(tmp / "bin") + "/",
                 *[f"k8s.io/kubernetes/cmd/{c}" for c in COMMANDS]], cwd=mod, env=go_env(),
                what=f"go build kubernetes {version}")
        _verify(tmp / "bin", version)
        return {"version": version, "source": "build"}
    return produce(out, build, force)


def cached_kubeadm(version: str) -> Path | None:
    """kubeadm of ``version`` if it is already on this host (built or from the
    release directory); never builds."""
    release_dir = os.environ.get(RELEASE_DIR_ENV)
    if release_dir:
        p = Path(release_dir.replace("{version}", version)) / "kubeadm"
        return p if p.is_file() else None
    if version != pinned_version() and not is_complete(cache_dir() / "kube-src" / version):
        return None
    try:
        out = output_dir(version)
    except BuildError:
        return None
    return out / "bin" / "kubeadm" if is_complete(out) else None


def _verify(bindir: Path, version: str) -> None:
    for c in COMMANDS:
        if not (bindir / c).is_file():
            raise BuildError(f"{bindir}: {c} missing")
    got = subprocess.run([str(bindir / "kubeadm"), "version", "-o", "short"], capture_output=True,
                         text=True).stdout.strip()
    if got != version:
        raise BuildError(f"{bindir}/kubeadm reports version {got!r}, expected {version}")


def _from_release(version: str, release_dir: Path) -> Path:
    if not release_dir.is_dir():
        raise BuildError(f"release_dir {str(release_dir)!r}: not a directory; allowed: a directory with the "
                         f"official {version} binaries ({', '.join(COMMANDS)}), e.g. kubernetes/server/bin")
    missing = [c for c in COMMANDS if not (release_dir / c).is_file()]
    if missing:
        raise BuildError(f"release_dir {release_dir}: missing {', '.join(missing)}")
    _verify(release_dir, version)
    # keyed by the binaries' content: another copy of the same release is a cache hit
    key = digest(*[file_digest(release_dir / c) for c in COMMANDS])

    def copy(tmp: Path) -> dict:
        (tmp / "bin").mkdir()
        for c in COMMANDS:
            shutil.copy2(release_dir / c, tmp / "bin" / c)
            os.chmod(tmp / "bin" / c, 0o755)
        return {"version": version, "source": "release", "from": str(release_dir)}
    return produce(cache_dir() / "kube" / f"{version}-release-{key[:12]}", copy)


def kubeadm_images(bindir: Path, version: str) -> dict[str, str]:
    """What kubeadm pulls for ``version``: component -> tag."""
    out = run([str(bindir / "kubeadm"), "config", "images", "list", "--kubernetes-version", version],
              what="kubeadm config images list")
    images = {}
    for tag in out.split():
        name = tag.rsplit("/", 1)[-1].split(":")[0]
        images[name] = tag
    return images
