"""Small general-purpose images the harness's own suites run in pods.

No registry is reachable, and the node image only preloads what kubeadm
needs (kube-*, etcd, CoreDNS, pause: none with a shell). So the suites use
``kube-harness/busybox:<hash>``: the Debian ``busybox-static`` package
(``apt-get download``, ``dpkg-deb -x``) with every applet linked in /bin,
``docker import``-ed. It has sh, httpd, nc, wget and nslookup: enough for
an HTTP server behind a Service and DNS/HTTP clients.

* :func:`test_images` builds (or finds) the images and returns their tags;
  a node image build may include them in its preload list.
* :func:`ensure_loaded` imports them into a running cluster's nodes
  (:mod:`harness.images_load`) when a node lacks
  them, so suites do not depend on the node image having them.

The tag's hash covers the .deb file name and this recipe, so a rebuild
happens only when either changes. Pods must use ``imagePullPolicy:
IfNotPresent`` or ``Never``.
"""
from __future__ import annotations

import logging
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from . import cache

if TYPE_CHECKING:  # pragma: no cover
    from harness.cluster import Cluster

log = logging.getLogger("harness.build.testimages")

REPOSITORY = "kube-harness/busybox"
RECIPE_VERSION = "2"
PACKAGE = "busybox-static"
_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"
_DIRS = (("bin", 0o755), ("dev", 0o755), ("etc", 0o755), ("proc", 0o555), ("root", 0o700), ("sys", 0o555),
         ("tmp", 0o1777), ("usr", 0o755), ("usr/bin", 0o755), ("sbin", 0o755), ("var", 0o755),
         ("var/www", 0o755))


def cache_dir() -> Path:
    d = cache.cache_dir() / "test-images"
    d.mkdir(exist_ok=True)
    return d


def busybox_deb() -> Path:
    """The busybox-static .deb (cached; ``apt-get download`` on a miss)."""
    d = cache_dir() / "debs"
    d.mkdir(exist_ok=True)
    debs = sorted(d.glob(f"{PACKAGE}_*.deb"))
    if debs:
        return debs[-1]
    with cache.lock("test-images-debs", timeout=600):
        debs = sorted(d.glob(f"{PACKAGE}_*.deb"))
        if not debs:
            # as root, apt drops to _apt which cannot write here; that only warns
            cache.run(["apt-get", "download", "-q", PACKAGE], cwd=d, what=f"apt-get download {PACKAGE}")
            debs = sorted(d.glob(f"{PACKAGE}_*.deb"))
    if not debs:
        raise cache.BuildError(f"apt-get download {PACKAGE} left no .deb in {d}")
    return debs[-1]


def _recipe_hash(deb: Path) -> str:
    return cache.digest(RECIPE_VERSION, deb.name, _PASSWD, _GROUP, Path(__file__))


def busybox_tag(deb: Path | None = None) -> str:
    return f"{REPOSITORY}:{_recipe_hash(deb or busybox_deb())[:12]}"


def _write_rootfs(deb: Path, out: Path) -> None:
    """The image's rootfs: busybox with every applet linked in /bin, passwd, group, a web root."""
    with tempfile.TemporaryDirectory(prefix="kh-busybox-") as d:
        cache.run(["dpkg-deb", "-x", str(deb), d], what=f"dpkg-deb -x {deb.name}")
        bb = next((p for p in (Path(d) / "bin/busybox", Path(d) / "usr/bin/busybox") if p.exists()), None)
        if bb is None:
            raise cache.BuildError(f"{deb.name} has no bin/busybox")
        applets = set(cache.run([str(bb), "--list"], what="busybox --list", stderr=False).split())
        with tarfile.open(out, mode="w") as tf:
            for name, mode in _DIRS:
                cache.tar_add(tf, name, dir=True, mode=mode)
            cache.tar_add(tf, "bin/busybox", data=bb.read_bytes(), mode=0o755)
            for a in sorted(applets - {"busybox", "linuxrc", "init"}):
                cache.tar_add(tf, f"bin/{a}", link="busybox")
            cache.tar_add(tf, "etc/passwd", data=_PASSWD.encode())
            cache.tar_add(tf, "etc/group", data=_GROUP.encode())
            cache.tar_add(tf, "etc/nsswitch.conf", data=b"hosts: files dns\n")
            cache.tar_add(tf, "var/www/index.html", data=b"kube-harness busybox\n")


def build_busybox(force: bool = False) -> str:
    """Build (or find) ``kube-harness/busybox:<hash12>``; returns the tag."""
    deb = busybox_deb()
    tag = busybox_tag(deb)
    if not force and cache.image_id(tag):
        return tag
    with cache.lock(f"test-images-{tag.rsplit(':', 1)[1]}", timeout=600):
        if force or not cache.image_id(tag):
            with tempfile.TemporaryDirectory(prefix="kh-busybox-") as d:
                tar = Path(d) / "rootfs.tar"
                _write_rootfs(deb, tar)
                cache.docker_import(tar, tag, None, changes=("ENV PATH=/bin:/usr/bin:/sbin", 'CMD ["sh"]'),
                                    labels={"harness.k8s.io/deb": deb.name})
            log.info(f"built {tag} from {deb.name}")
    return tag


def test_images() -> list[str]:
    """Tags of the harness's test images (built if missing)."""
    return [build_busybox()]


def ensure_loaded(cluster: "Cluster", images: Iterable[str] | None = None) -> dict[str, list[str]]:
    """Import the images into every running node's containerd that lacks them
    (:func:`harness.images_load.load_images`). Returns ``{machine: imported}``."""
    from ..images_load import load_images
    machines = [m for m in cluster.machines() if m.role in ("control-plane", "worker") and m.state == "running"]
    return load_images(cluster, list(images) if images is not None else test_images(), machines=machines)


if __name__ == "__main__":  # pragma: no cover
    print("\n".join(test_images()))
