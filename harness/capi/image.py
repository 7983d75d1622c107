"""The controller's container image, built locally (no registry):

* a Debian bookworm rootfs with ``python3`` from mmdebstrap (Debian's apt
  mirror, the machine's own apt sources);
* the Python dependencies (kubernetes, docker, PyYAML, filelock, psutil,
  cryptography at
  the versions installed here) installed with ``pip install --target`` for
  CPython 3.11 manylinux wheels, into ``/opt/kube-harness/site``;
* the harness source (``harness/``, ``providers/``) in ``/opt/kube-harness/app``;
* ``docker import`` with ``PYTHONPATH`` and the controller as entrypoint.

Tagged ``kube-harness/capi-controller:<hash>`` (hash of the recipe, the
source and the dependency versions); the rootfs is cached under
``$KUBE_HARNESS_CACHE/capi-image/``.
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

from filelock import FileLock

from harness.progress import phase

from .crds import cache_root

log = logging.getLogger("harness.capi")
ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = "kube-harness/capi-controller"
RECIPE = "capi-controller-v1"
SUITE = "bookworm"
PACKAGES = ("python3", "ca-certificates")
DEPS = ("kubernetes", "docker", "PyYAML", "filelock", "psutil", "cryptography")
PYTHON = "3.11"  # bookworm's python3


class ImageError(RuntimeError):
    pass


def _sources() -> list[Path]:
    from providers.docker.nodeimage.base import apt_sources
    return apt_sources()


def _source_files() -> list[Path]:
    out = []
    for top in ("harness", "providers"):
        for p in sorted((ROOT / top).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc",):
                out.append(p)
    return out


def requirements() -> list[str]:
    reqs = []
    for d in DEPS:
        try:
            reqs.append(f"{d}=={metadata.version(d)}")
        except metadata.PackageNotFoundError:
            reqs.append(d)
    return reqs


def image_tag() -> str:
    h = hashlib.sha256()
    h.update(RECIPE.encode())
    h.update(repr((SUITE, PACKAGES, requirements(), PYTHON)).encode())
    for p in _source_files():
        h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    return f"{REPOSITORY}:{h.hexdigest()[:12]}"


def _exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def _run(cmd: list[str], what: str, **kw) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise ImageError(f"{what} failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-2000:]}")


def _rootfs(cache: Path) -> Path:
    key = hashlib.sha256(repr((SUITE, PACKAGES, [p.read_text() for p in _sources()])).encode()).hexdigest()[:12]
    tar = cache / f"rootfs-{key}.tar"
    if tar.exists():
        return tar
    if not shutil.which("mmdebstrap"):
        raise ImageError("mmdebstrap is not installed (apt-get install mmdebstrap)")
    tmp = tar.with_suffix(".tmp")
    with phase("capi-image-rootfs", logger=log):
        _run(["mmdebstrap", "--mode=root", "--variant=minbase", "--format=tar", "--include=" + ",".join(PACKAGES),
              "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
              "--dpkgopt=path-exclude=/usr/share/locale/*", SUITE, str(tmp), *[str(p) for p in _sources()]],
             "mmdebstrap", timeout=1800)
    os.replace(tmp, tar)
    return tar


def _site(dest: Path) -> None:
    with phase("capi-image-deps", logger=log):
        _run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
              "--target", str(dest), "--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp",
              "--abi", "cp311", "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
              "--platform", "manylinux_2_28_x86_64", "--platform", "any", *requirements()],
             "pip install --target", timeout=1800)


def build_controller_image(force: bool = False) -> str:
    tag = image_tag()
    if not force and _exists(tag):
        return tag
    cache = cache_root().parent / "capi-image"
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache / "build.lock"), timeout=3600):
        if not force and _exists(tag):
            return tag
        with phase("capi-image", machine=tag, logger=log), tempfile.TemporaryDirectory(prefix="kh-capi-img-") as t:
            rootfs = _rootfs(cache)
            site = Path(t) / "site"
            _site(site)
            out = Path(t) / "image.tar"
            shutil.copyfile(rootfs, out)
            with tarfile.open(out, "a") as tf:
                tf.add(site, arcname="opt/kube-harness/site")
                for p in _source_files():
                    tf.add(p, arcname=f"opt/kube-harness/app/{p.relative_to(ROOT)}")
                info = tarfile.TarInfo("opt/kube-harness/IMAGE")
                data = f"{tag}\n".encode()
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            _run(["docker", "import",
                  "--change", "ENV PYTHONPATH=/opt/kube-harness/app:/opt/kube-harness/site",
                  "--change", "ENV PYTHONUNBUFFERED=1",
                  "--change", "WORKDIR /opt/kube-harness/app",
                  "--change", 'ENTRYPOINT ["python3", "-m", "harness.capi.controller"]',
                  str(out), tag], "docker import", timeout=600)
        log.info(f"built {tag}", extra={"phase": "capi-image"})
    return tag


if __name__ == "__main__":
    from harness import progress
    progress.configure()
    print(build_controller_image(force="--force" in sys.argv))
