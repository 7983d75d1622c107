"""The node's container runtime built from the Go module proxy: pinned
versions, static binaries, cache hits. The first run builds (minutes); later
runs are served from the cache."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from harness.build import runtime
from harness.build.cache import DONE, BuildError

pytestmark = [pytest.mark.slow]
V = runtime.RUNTIME_VERSIONS
CRICTL = "v1.37.0"  # cri-tools of the default Kubernetes minor
CNI = [p.rsplit("/", 1)[1] for p in runtime.CNI_PLUGINS]


@pytest.fixture(scope="module")
def built():
    return {**runtime.build_runtime(), "crictl": runtime.build_crictl(CRICTL)}


def output(path, *args, env=None) -> str:
    p = subprocess.run([str(path), *args], capture_output=True, text=True, timeout=60,
                       env=None if env is None else {"PATH": os.environ["PATH"], **env})
    return p.stdout + p.stderr


def assert_static(path) -> None:
    assert runtime.is_static(path), path
    assert "not a dynamic executable" in output("ldd", path), path


def test_containerd_binaries(built):
    b = built["containerd"] / "bin"
    assert f"containerd github.com/containerd/containerd/v2 {V['containerd']}" in output(b / "containerd", "--version")
    assert f"ctr github.com/containerd/containerd/v2 {V['containerd']}" in output(b / "ctr", "--version")
    assert f"Version:  {V['containerd']}" in output(b / "containerd-shim-runc-v2", "-v")
    for c in ("containerd", "ctr", "containerd-shim-runc-v2"):
        assert_static(b / c)


def test_runc_is_static_with_seccomp(built):
    runc = built["runc"] / "bin" / "runc"
    out = output(runc, "--version")
    assert f"runc version {V['runc'].lstrip('v')}" in out
    assert "libseccomp: 2." in out
    assert json.loads(output(runc, "features"))["linux"]["seccomp"]["enabled"]
    assert_static(runc)


def test_crictl(built):
    crictl = built["crictl"] / "bin" / "crictl"
    assert f"crictl version {CRICTL}" in output(crictl, "--version")
    assert_static(crictl)


def test_cni_plugins(built):
    b = built["cni-plugins"] / "bin"
    assert sorted(p.name for p in b.iterdir()) == sorted(CNI)
    for p in CNI:
        assert "1.0.0" in json.loads(output(b / p, env={"CNI_COMMAND": "VERSION"}))["supportedVersions"]
        assert f"CNI {p} plugin {V['cni-plugins']}" in output(b / p, env={})
        assert_static(b / p)


def test_second_build_is_a_cache_hit(built):
    calls = {"containerd": runtime.build_containerd, "runc": runtime.build_runc,
             "cni-plugins": runtime.build_cni_plugins, "crictl": lambda: runtime.build_crictl(CRICTL)}
    for name, call in calls.items():
        d = built[name]
        before = [(p, p.stat().st_mtime_ns) for p in [d, d / DONE, *sorted((d / "bin").iterdir())]]
        marker = (d / DONE).read_text()
        assert call() == d
        assert [(p, p.stat().st_mtime_ns) for p, _ in before] == before
        assert (d / DONE).read_text() == marker


def test_crictl_version_checked():
    with pytest.raises(BuildError, match="allowed: vMAJOR"):
        runtime.build_crictl("1.37")
    with pytest.raises(BuildError, match="v1.35.0"):  # not served by the module proxy
        runtime.build_crictl("v1.35.0")
