"""The supported-version table (harness.versions) against what the real
kubeadm of each built release asks for, and how versions are accepted."""
from __future__ import annotations

import subprocess

import pytest

from harness import versions
from harness.build import kube


def test_one_entry_per_minor():
    assert sorted(versions.RELEASES) == [35, 36, 37]
    for minor, r in versions.RELEASES.items():
        assert versions.parse(r.version)[:2] == (1, minor)
    assert versions.release(versions.DEFAULT_VERSION).version == versions.DEFAULT_VERSION == "v1.37.2"
    assert versions.release(versions.PREVIOUS_VERSION).minor == versions.release(versions.DEFAULT_VERSION).minor - 1


def test_default_is_the_pinned_build_module():
    assert kube.pinned_version() == kube.default_version() == versions.DEFAULT_VERSION


@pytest.mark.parametrize("v", ["v1.35.0", "v1.35.4", "v1.36.1", "v1.36.3", "v1.37.2", "v1.37.99"])
def test_any_patch_of_a_supported_minor(v):
    assert versions.problem(v) is None
    assert versions.release(v).minor == versions.parse(v)[1]


@pytest.mark.parametrize("v", ["v1.34.4", "v1.38.0", "v2.37.2", "1.37.2", "v1.37", "latest", "", None, 137])
def test_others_are_refused_with_the_list(v):
    why = versions.problem(v)
    assert why and "v1.35.x, v1.36.x, v1.37.x" in why
    with pytest.raises(ValueError, match=r"allowed: .*v1\.35\.x, v1\.36\.x, v1\.37\.x"):
        versions.release(v)


@pytest.mark.parametrize("version", [versions.DEFAULT_VERSION, versions.PREVIOUS_VERSION])
def test_table_matches_kubeadm(version):
    """etcd, CoreDNS and pause in the table are what the built kubeadm lists."""
    bindir = kube.build_kubernetes(version) / "bin"
    out = subprocess.run([str(bindir / "kubeadm"), "config", "images", "list", "--kubernetes-version", version],
                         capture_output=True, text=True, check=True).stdout.split()
    tags = {t.rsplit("/", 1)[1].split(":")[0]: t.rsplit(":", 1)[1] for t in out}
    r = versions.release(version)
    assert (tags["etcd"], tags["coredns"], tags["pause"]) == (r.etcd, r.coredns, r.pause)
    assert tags["kube-apiserver"] == version
