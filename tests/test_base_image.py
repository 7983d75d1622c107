"""The node base image, built for real with mmdebstrap and docker import."""
from __future__ import annotations

import json
import re
import time
import uuid

import pytest

docker = pytest.importorskip("docker")

from providers.docker.nodeimage import base  # noqa: E402

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def client():
    try:
        c = docker.from_env(timeout=600)
        c.ping()
    except Exception as e:  # pragma: no cover - no engine here
        pytest.skip(f"no Docker engine: {e}")
    yield c
    c.close()


@pytest.fixture(scope="module")
def tag(client):
    return base.build_base_image()


def sh(client, image: str, script: str) -> str:
    """Run a shell script in a throwaway container of the image (no systemd)."""
    # not run(remove=True): that keeps the anonymous volume of the image's VOLUME /var
    c = client.containers.create(image, entrypoint=["/bin/bash", "-c", script])
    try:
        c.start()
        rc = c.wait(timeout=120)["StatusCode"]
        out = c.logs(stdout=True, stderr=True).decode()
    finally:
        c.remove(v=True, force=True)
    if rc != 0:
        raise AssertionError(f"exit {rc}: {out[-2000:]}")
    return out


def test_tag_is_content_hash(tag):
    assert re.fullmatch(r"kube-harness/base:[0-9a-f]{12}", tag)
    assert tag == base.image_tag()
    assert tag.split(":")[1] == base.content_hash()[:12]
    # every input is in the hash
    assert base.content_hash(sandbox_image="registry.k8s.io/pause:9.9") != base.content_hash()
    assert base.content_hash(volume_var=False) != base.content_hash()
    assert base.content_hash(runtime={}) != base.content_hash()


def test_second_build_is_a_noop(client, tag):
    before = {i.id for i in client.images.list(name=base.REPOSITORY)}
    img_id = client.images.get(tag).id
    tarballs = {p: p.stat().st_mtime for p in base.base_cache_dir().glob("rootfs-*.tar")}
    assert base.build_base_image() == tag
    assert client.images.get(tag).id == img_id
    assert {i.id for i in client.images.list(name=base.REPOSITORY)} == before
    assert {p: p.stat().st_mtime for p in base.base_cache_dir().glob("rootfs-*.tar")} == tarballs


def test_rootfs_tarball_is_cached(tag):
    cached = base.base_cache_dir() / f"rootfs-{base.rootfs_hash()[:12]}.tar"
    assert cached.is_file() and cached.stat().st_size > 100 * 2**20


def test_image_config(client, tag):
    cfg = client.images.get(tag).attrs["Config"]
    assert cfg["Entrypoint"] == ["/usr/local/bin/entrypoint.sh"]
    assert cfg["Cmd"] == ["/sbin/init"]
    assert "container=docker" in cfg["Env"]
    assert cfg["StopSignal"] == "SIGRTMIN+3"
    assert "/var" in (cfg.get("Volumes") or {})
    assert cfg["Labels"]["harness.k8s.io/image"] == "base"
    assert cfg["Labels"]["harness.k8s.io/content-hash"] == base.content_hash()


def test_image_content(client, tag):
    out = sh(client, tag, r"""
set -e
for b in containerd runc ctr iptables conntrack ebtables ethtool socat ip tc kmod mount nsenter findmnt ps haproxy \
         systemctl journalctl update-alternatives getent curl; do
  command -v $b >/dev/null || echo "MISSING $b"
done
test -x /sbin/init && echo init-ok
ls /opt/cni/bin | tr '\n' ' '; echo
test -d /etc/cni/net.d && echo cni-conf-ok
grep -E 'SystemdCgroup|sandbox|snapshotter|bin_dirs|conf_dir|^version' /etc/containerd/config.toml
systemctl is-enabled containerd kubelet || true
systemctl is-enabled haproxy console-getty.service 2>&1 || true
cat /etc/systemd/system/kubelet.service.d/10-kubeadm.conf | grep '^ExecStart=/usr/bin/kubelet'
test ! -s /etc/machine-id && echo machine-id-empty
cat /etc/crictl.yaml
containerd --version
runc --version
containerd config dump | grep -E "^version|sandbox = "
test -f /etc/systemd/system/containerd.service && echo unit-ok
dpkg -l containerd runc containernetworking-plugins 2>/dev/null | grep -c '^ii' || true
""")
    assert "MISSING" not in out, out
    assert "init-ok" in out
    for plugin in ("bridge", "host-local", "loopback", "portmap", "ptp"):
        assert plugin in out.split("\n")[1].split(), out
    assert "cni-conf-ok" in out
    assert "SystemdCgroup = true" in out
    assert f'sandbox = "{base.DEFAULT_SANDBOX_IMAGE}"' in out
    assert 'snapshotter = "overlayfs"' in out
    assert 'bin_dirs = ["/opt/cni/bin"]' in out and 'conf_dir = "/etc/cni/net.d"' in out
    assert "version = 4" in out  # containerd 2's config format, read back by containerd itself
    assert "unit-ok" in out
    assert out.count("enabled") >= 2
    assert "masked" in out  # haproxy / getty do not run on nodes
    assert "machine-id-empty" in out
    assert "runtime-endpoint: unix:///run/containerd/containerd.sock" in out
    # the runtime is the one built from the Go module proxy, not Debian's packages
    from harness.build.runtime import RUNTIME_VERSIONS
    assert f"containerd github.com/containerd/containerd/v2 {RUNTIME_VERSIONS['containerd']}" in out
    assert f"runc version {RUNTIME_VERSIONS['runc'].lstrip('v')}" in out
    assert out.rstrip().endswith("\n0")


def test_sandbox_image_can_be_changed_by_a_derived_build(client, tag):
    out = sh(client, tag, "kh-sandbox-image.sh registry.k8s.io/pause:3.99 && grep sandbox /etc/containerd/config.toml")
    assert 'sandbox = "registry.k8s.io/pause:3.99"' in out


@pytest.mark.slow
def test_build_from_scratch(client, tmp_path, monkeypatch):
    """An uncached build (fresh cache dir, distinct inputs so the shared tag is
    untouched), then the same call again is a no-op."""
    runtime = base.runtime_files()  # from the shared cache: the Go builds are tested elsewhere
    monkeypatch.setenv("KUBE_HARNESS_CACHE", str(tmp_path))
    sandbox = f"registry.k8s.io/pause:test-{uuid.uuid4().hex[:8]}"
    phases: list[str] = []
    t0 = time.monotonic()
    tag = base.build_base_image(progress=lambda phase, msg: phases.append(phase), sandbox_image=sandbox,
                                runtime=runtime)
    took = time.monotonic() - t0
    try:
        assert tag == base.image_tag(sandbox, runtime=runtime)
        assert {"rootfs", "import", "done"} <= set(phases)
        assert (tmp_path / "base" / f"rootfs-{base.rootfs_hash(sandbox, runtime)[:12]}.tar").is_file()
        assert f'sandbox = "{sandbox}"' in sh(client, tag, "grep sandbox /etc/containerd/config.toml")
        phases.clear()
        assert base.build_base_image(progress=lambda phase, msg: phases.append(phase), sandbox_image=sandbox,
                                     runtime=runtime) == tag
        assert phases == []
        print(json.dumps({"uncached_build_s": round(took, 1)}))
    finally:
        client.images.remove(tag, force=True)
