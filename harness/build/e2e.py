"""The e2e test binaries: e2e.test (conformance), e2e_kubeadm.test
(kubeadm's own e2e suite) and the ginkgo CLI that runs them in parallel.

Both test binaries are ``go test -c`` of the same k8s.io/kubernetes module
as the cluster's binaries (:func:`harness.build.kube.module_dir`), cached
by version, module files, flags and Go version.  $KUBE_HARNESS_E2E_BINARY /
$KUBE_HARNESS_E2E_KUBEADM_BINARY name prebuilt ones instead (e.g. from a
release's kubernetes-test tarball)."""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from . import cache, kube

log = logging.getLogger("harness.build")

#: test binary name -> (its Go package, the env var naming a prebuilt one)
SUITES = {
    "e2e.test": ("k8s.io/kubernetes/test/e2e", "KUBE_HARNESS_E2E_BINARY"),
    "e2e_kubeadm.test": ("k8s.io/kubernetes/test/e2e_kubeadm", "KUBE_HARNESS_E2E_KUBEADM_BINARY"),
}


def _go_build(out: Path, args: list[str], what: str, cwd: Path, generated: bool = False) -> Path:
    """``go <args> -o out`` in ``cwd`` unless ``out`` exists (cache entry)."""
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with cache.lock(f"e2e-{out.parent.name}-{out.name}"):
        if out.exists():
            return out
        t0 = time.monotonic()
        log.info(f"building {what} (cached in {out.parent})", extra={"phase": "build-e2e"})
        tmp = out.with_name(out.name + ".tmp")
        env = kube.go_env()
        if generated:  # a generated module for another version: let go add test deps
            env["GOFLAGS"] = (env.get("GOFLAGS", "") + " -mod=mod").strip()
        cache.run(["go", args[0], "-o", str(tmp), *args[1:]], cwd=cwd, env=env, what=f"build {what}")
        tmp.rename(out)
        secs = time.monotonic() - t0
        log.info(f"built {what} in {secs:.0f}s", extra={"phase": "build-e2e", "elapsed": round(secs, 1)})
    return out


def test_binary_path(version: str | None = None, name: str = "e2e.test") -> Path:
    """Where the test binary ``name`` of ``version`` is cached (built or not)."""
    version = version or kube.default_version()
    mod = kube.module_dir(version)
    key = cache.digest("e2e-v1", version, mod / "go.mod", mod / "go.sum", kube.ldflags(version),
                       kube.go_version())
    return cache.cache_dir() / "e2e" / f"{version}-{key[:12]}" / name


def ensure_test_binary(version: str | None = None, name: str = "e2e.test") -> Path:
    """The test binary ``name`` (a key of :data:`SUITES`) of ``version``."""
    package, env = SUITES[name]
    if os.environ.get(env):
        return Path(os.environ[env])
    version = version or kube.default_version()
    return _go_build(test_binary_path(version, name),
                     ["test", "-c", "-trimpath", "-ldflags", kube.ldflags(version), package],
                     f"{name} {version}", kube.module_dir(version), version != kube.pinned_version())


def ensure_e2e(version: str | None = None) -> Path:
    return ensure_test_binary(version, "e2e.test")


def ensure_e2e_kubeadm(version: str | None = None) -> Path:
    return ensure_test_binary(version, "e2e_kubeadm.test")


def ensure_ginkgo() -> Path:
    """The ginkgo CLI (parallel runs) at the version the kube-build module requires."""
    kb = kube.KUBE_BUILD
    key = cache.digest("ginkgo-v1", kb / "go.mod", kb / "go.sum", kube.go_version())
    out = cache.cache_dir() / "e2e" / f"ginkgo-{key[:12]}" / "ginkgo"
    return _go_build(out, ["build", "-trimpath", "github.com/onsi/ginkgo/v2/ginkgo"], "ginkgo CLI",
                     kube.pinned_module())
