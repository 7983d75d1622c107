"""The air-gapped build: real Go-built binaries, local images, cache hits.
ci/setup.sh builds everything first, so these tests exercise the cache and
check the artifacts themselves."""
from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import time
import uuid

import docker
import pytest

from harness.build import cache, images, kube, nodeimage
from harness.build.cache import DONE, BuildError
from harness.versions import release

pytestmark = [pytest.mark.docker]
VERSION = kube.default_version()


@pytest.fixture(scope="module")
def kube_dir():
    return kube.build_kubernetes(VERSION)


def test_binaries_report_the_version(kube_dir):
    for c in kube.COMMANDS:
        out = subprocess.run([str(kube_dir / "bin" / c), "--version"], capture_output=True, text=True)
        text = out.stdout + out.stderr
        if c == "kubeadm":
            text = subprocess.run([str(kube_dir / "bin" / c), "version", "-o", "short"], capture_output=True,
                                  text=True).stdout
        elif c == "kubectl":
            text = subprocess.run([str(kube_dir / "bin" / c), "version", "--client"], capture_output=True,
                                  text=True).stdout
        assert VERSION in text, (c, text)
    # static: no dynamic loader needed inside minimal images
    file_out = subprocess.run(["ldd", str(kube_dir / "bin" / "kube-apiserver")], capture_output=True, text=True)
    assert "not a dynamic executable" in (file_out.stdout + file_out.stderr)


def test_second_build_is_served_from_cache(kube_dir):
    marker = kube_dir / DONE
    before = marker.stat().st_mtime_ns
    again = kube.build_kubernetes(VERSION)
    assert again == kube_dir
    assert marker.stat().st_mtime_ns == before  # nothing was built again


def test_images_are_tagged_as_kubeadm_lists(kube_dir):
    wanted = set(kube.kubeadm_images(kube_dir / "bin", VERSION).values())
    built = set(images.build_component_images(VERSION, kube_dir))
    assert wanted == built
    dk = docker.from_env()
    for t in wanted:
        dk.images.get(t)  # raises if missing


def test_component_images_run():
    dk = docker.from_env()
    tags = images.build_component_images(VERSION)
    etcd = next(t for t in tags if "/etcd:" in t)
    out = dk.containers.run(etcd, ["--version"], remove=True).decode()
    assert "etcd Version: 3." in out
    coredns = next(t for t in tags if "coredns" in t)
    assert "CoreDNS-" in dk.containers.run(coredns, ["-version"], remove=True).decode()
    pause = next(t for t in tags if "/pause:" in t)
    c = dk.containers.run(pause, detach=True)
    try:
        time.sleep(1)
        c.reload()
        assert c.status == "running"
        c.stop(timeout=5)  # pause exits on SIGTERM
        assert c.wait(timeout=10)["StatusCode"] == 0
    finally:
        c.remove(force=True)
    proxy = next(t for t in tags if "kube-proxy" in t)
    out = dk.containers.run(proxy, entrypoint="sh", command=["-c", "timeout 20 iptables -V; timeout 20 conntrack --version"],
                            remove=True, privileged=False, cap_add=["NET_ADMIN"]).decode()
    assert "iptables v1." in out and "conntrack" in out


def test_node_image_is_cached_and_preloaded():
    tag = nodeimage.build_node_image(VERSION)
    dk = docker.from_env()
    built = dk.images.get(tag).id
    assert nodeimage.build_node_image(VERSION) == tag and dk.images.get(tag).id == built  # cached: same image
    img = dk.images.get(tag)
    assert img.labels["harness.k8s.io/kubernetes-version"] == VERSION
    assert "/var" not in (img.attrs["Config"].get("Volumes") or {})
    out = dk.containers.run(tag, entrypoint="sh", remove=True, command=[
        "-c", "kubeadm version -o short; ls /var/lib/containerd/io.containerd.content.v1.content/blobs/sha256 | wc -l"
    ]).decode().split()
    assert out[0] == VERSION
    assert int(out[1]) > 7  # manifests, configs and layers of the preloaded images


def test_release_binaries_feed_the_node_image(kube_dir, tmp_path, monkeypatch):
    """Users with internet: official release binaries instead of the Go build.
    A directory laid out like a release (kubernetes/server/bin) of real
    binaries, named by $KUBE_HARNESS_RELEASE_DIR with {version}."""
    dk = docker.from_env()
    components = images.build_component_images(VERSION, kube_dir)
    ids = {t: dk.images.get(t).id for t in components}
    bindir = tmp_path / VERSION / "kubernetes" / "server" / "bin"
    bindir.mkdir(parents=True)
    for c in kube.COMMANDS:
        shutil.copy2(kube_dir / "bin" / c, bindir / c)
    monkeypatch.setenv(kube.RELEASE_DIR_ENV, str(tmp_path / "{version}" / "kubernetes" / "server" / "bin"))
    rel = kube.build_kubernetes(VERSION)
    assert "-release-" in rel.name and rel != kube_dir
    assert json.loads((rel / DONE).read_text())["source"] == "release"
    tag = nodeimage.build_node_image(VERSION)
    try:
        # the same binaries from elsewhere: component images are cache hits, not rebuilt
        assert {t: dk.images.get(t).id for t in components} == ids
        assert tag != nodeimage.node_image_tag(VERSION, nodeimage.base_image(), kube_dir, [],
                                                   nodeimage.runtime.build_crictl(release(VERSION).crictl))[0]
        out = dk.containers.run(tag, entrypoint="kubeadm", command=["version", "-o", "short"], remove=True)
        assert out.decode().strip() == VERSION
    finally:
        dk.images.remove(tag, force=True)
    # a release directory of another version is refused, naming what it found
    (tmp_path / "v1.36.3").symlink_to(tmp_path / VERSION)
    with pytest.raises(BuildError, match=f"reports version '{VERSION}', expected v1.36.3"):
        kube.build_kubernetes("v1.36.3")


@pytest.mark.parametrize("bad", ["1.37.2", "v1.37", "latest", "", "v1.34.4", "v1.38.0"])
def test_bad_version_is_named(bad):
    with pytest.raises(BuildError, match="invalid Kubernetes version .*v1.35.x, v1.36.x, v1.37.x"):
        kube.build_kubernetes(bad)


def test_release_dir_must_exist(tmp_path):
    with pytest.raises(BuildError, match="release_dir"):
        kube.build_kubernetes(VERSION, source="release", release_dir=tmp_path / "nope")


def test_prebuilt_node_image_must_exist():
    with pytest.raises(BuildError, match="not found locally"):
        nodeimage.build_node_image(image="kube-harness/node:does-not-exist")


def test_silent_command_shows_progress_and_times_out(caplog):
    """go build prints nothing for minutes: the heartbeat and the timeout must
    not depend on output lines."""
    caplog.set_level("INFO", logger="harness.build")
    assert cache.run(["sh", "-c", "sleep 1.2; echo done"], what="quiet", heartbeat=0.3) == "done\n"
    beats = [r for r in caplog.records if r.getMessage().startswith("still running")]
    assert len(beats) >= 2 and all(r.phase == "quiet" for r in beats)
    t0 = time.monotonic()
    with pytest.raises(BuildError, match="timed out after 1s"):
        cache.run(["sleep", "60"], what="stuck", timeout=1, heartbeat=0.2)
    assert time.monotonic() - t0 < 10


def test_failed_command_error_has_output_tail():
    with pytest.raises(BuildError, match=r"(?s)failed \(exit 3\).*boom"):
        cache.run(["sh", "-c", "echo boom; exit 3"], what="failing")


def test_rebuilt_tag_leaves_no_dangling_image(tmp_path):
    """A rebuild (new content under the same tag) removes the image it replaced."""
    tag = f"kube-harness/test-rebuild:{uuid.uuid4().hex[:8]}"
    dk = docker.from_env()
    ids = []
    try:
        for content in (b"one", b"two"):
            tar = tmp_path / "rootfs.tar"
            with tarfile.open(tar, "w") as tf:
                cache.tar_add(tf, "data", data=content)
            cache.docker_import(tar, tag, content.decode())
            ids.append(dk.images.get(tag).id)
        assert ids[0] != ids[1]
        with pytest.raises(docker.errors.ImageNotFound):
            dk.images.get(ids[0])
    finally:
        for i in ids:
            try:
                dk.images.remove(i, force=True)
            except docker.errors.ImageNotFound:
                pass
