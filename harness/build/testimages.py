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

import hashlib
import io
import logging
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # pragma: no cover
    from harness.cluster import Cluster

log = logging.getLogger("harness.build.testimages")

REPOSITORY = "kube-harness/busybox"
RECIPE_VERSION = "1"
PACKAGE = "busybox-static"
_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"


class TestImageError(RuntimeError):
    pass


def cache_dir() -> Path:
    root = os.environ.get("KUBE_HARNESS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kube-harness")
    d = Path(root) / "test-images"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _run(cmd: list[str], *, cwd: Path | None = None, input: bytes | None = None, timeout: float = 600) -> bytes:
    p = subprocess.run(cmd, cwd=cwd, input=input, capture_output=True, timeout=timeout)
    if p.returncode != 0:
        raise TestImageError(f"{' '.join(cmd)} exited {p.returncode}: "
                             f"{(p.stderr or p.stdout).decode(errors='replace')[-2000:]}")
    return p.stdout


def busybox_deb() -> Path:
    """The busybox-static .deb (cached; ``apt-get download`` on a miss)."""
    d = cache_dir() / "debs"
    d.mkdir(exist_ok=True)
    debs = sorted(d.glob(f"{PACKAGE}_*.deb"))
    if debs:
        return debs[-1]
    from filelock import FileLock
    with FileLock(str(d / ".download.lock"), timeout=600):
        debs = sorted(d.glob(f"{PACKAGE}_*.deb"))
        if not debs:
            # as root, apt drops to _apt which cannot write here; that only warns
            _run(["apt-get", "download", "-q", PACKAGE], cwd=d)
            debs = sorted(d.glob(f"{PACKAGE}_*.deb"))
    if not debs:
        raise TestImageError(f"apt-get download {PACKAGE} left no .deb in {d}")
    return debs[-1]


def _recipe_hash(deb: Path) -> str:
    h = hashlib.sha256()
    for part in (RECIPE_VERSION, deb.name, _PASSWD, _GROUP, Path(__file__).read_bytes()):
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()


def busybox_tag(deb: Path | None = None) -> str:
    return f"{REPOSITORY}:{_recipe_hash(deb or busybox_deb())[:12]}"


def _image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def _rootfs_tar(deb: Path) -> bytes:
    with tempfile.TemporaryDirectory(prefix="kh-busybox-") as d:
        _run(["dpkg-deb", "-x", str(deb), d])
        bb = next((p for p in (Path(d) / "bin/busybox", Path(d) / "usr/bin/busybox") if p.exists()), None)
        if bb is None:
            raise TestImageError(f"{deb.name} has no bin/busybox")
        applets = sorted(set(_run([str(bb), "--list"]).decode().split()) - {"busybox", "linuxrc", "init"})
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            def add(name: str, *, data: bytes | None = None, mode: int = 0o644, link: str | None = None,
                    dir: bool = False) -> None:
                ti = tarfile.TarInfo(name)
                ti.mode, ti.uid, ti.gid, ti.mtime = mode, 0, 0, 0
                if dir:
                    ti.type = tarfile.DIRTYPE
                    tf.addfile(ti)
                elif link is not None:
                    ti.type, ti.linkname = tarfile.SYMTYPE, link
                    tf.addfile(ti)
                else:
                    ti.size = len(data or b"")
                    tf.addfile(ti, io.BytesIO(data or b""))
            for dname, mode in (("bin", 0o755), ("dev", 0o755), ("etc", 0o755), ("proc", 0o555),
                                ("root", 0o700), ("sys", 0o555), ("tmp", 0o1777), ("usr", 0o755),
                                ("usr/bin", 0o755), ("sbin", 0o755), ("var", 0o755), ("var/www", 0o755)):
                add(dname, dir=True, mode=mode)
            add("bin/busybox", data=bb.read_bytes(), mode=0o755)
            for a in applets:
                add(f"bin/{a}", link="busybox")
            add("etc/passwd", data=_PASSWD.encode())
            add("etc/group", data=_GROUP.encode())
            add("etc/nsswitch.conf", data=b"hosts: files dns\n")
            add("var/www/index.html", data=b"kube-harness busybox\n")
        return buf.getvalue()


def build_busybox(force: bool = False) -> str:
    """Build (or find) ``kube-harness/busybox:<hash12>``; returns the tag."""
    deb = busybox_deb()
    tag = busybox_tag(deb)
    if not force and _image_exists(tag):
        return tag
    from filelock import FileLock
    with FileLock(str(cache_dir() / f"build-{tag.rsplit(':', 1)[1]}.lock"), timeout=600):
        if force or not _image_exists(tag):
            _run(["docker", "import", "--change", "ENV PATH=/bin:/usr/bin:/sbin",
                  "--change", 'CMD ["sh"]', "--change", f"LABEL harness.k8s.io/deb={deb.name}",
                  "-", tag], input=_rootfs_tar(deb))
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
