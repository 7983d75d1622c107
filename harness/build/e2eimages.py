"""Local builds of the e2e test images that the conformance tests run.

Nothing is pulled: every image is built on this machine and tagged under a
local registry name (``kube-harness.local`` by default), and the e2e
framework is pointed at those names with a ``KUBE_TEST_REPO_LIST`` file.
The build is split by concern:

* :mod:`.e2e_manifest`: which images, under which names (the module's
  ``test/utils/image/manifest.go``), and the repo list;
* :mod:`.e2e_rootfs`: the Debian root filesystems under them;
* :mod:`.e2e_recipes`: how each image is made;
* here: the :class:`Builder` (cached inputs: rootfs tarballs, Go binaries,
  .debs; images built unless fresh) and the entry points.

Every image carries the label ``harness.k8s.io/input-hash``; a build is
skipped when the tag exists with the same hash.  Rootfs tarballs and
binaries are cached under ``$KUBE_HARNESS_CACHE/e2e-images``.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

from . import kube
from .cache import (INPUT_HASH_LABEL, BuildError, digest, docker_build, docker_import, image_hash, image_tags, lock, produce_file,
                    run)
from .e2e_manifest import (CONFORMANCE_IMAGES, REGISTRY, SMOKE_IMAGES, ImageRef, cache_dir, manifest,
                           module_dir, parse_manifest, repo_list, write_repo_list)
from .e2e_recipes import RECIPES
from .e2e_rootfs import Rootfs, make_rootfs

__all__ = ["Builder", "build_e2e_images", "CONFORMANCE_IMAGES", "SMOKE_IMAGES", "REGISTRY", "RECIPES", "ImageRef",
           "cache_dir", "manifest", "module_dir", "parse_manifest", "repo_list", "write_repo_list"]
log = logging.getLogger("harness.build.e2eimages")
BASE_PATH = "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Builder:
    """Builds (or finds cached) images for one Kubernetes version."""

    def __init__(self, version: str | None = None, registry: str = REGISTRY, force: bool = False):
        self.version = version or kube.pinned_version()
        self.registry = registry
        self.force = force
        self._mod: Path | None = None
        self._refs: dict[str, ImageRef] | None = None
        self.built: dict[str, str] = {}  # id -> tag
        self.hashes: dict[str, str] = {}
        self.timings: dict[str, float] = {}
        self.skipped: dict[str, str] = {}
        self._go_inputs: str | None = None

    @property
    def mod(self) -> Path:
        if self._mod is None:
            self._mod = module_dir(self.version)
        return self._mod

    @property
    def refs(self) -> dict[str, ImageRef]:
        if self._refs is None:
            self._refs = parse_manifest((self.mod / "test/utils/image/manifest.go").read_text())
        return self._refs

    def tag(self, ident: str) -> str:
        return self.refs[ident].local(self.registry)

    # -- inputs
    def _timed(self, what: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
        def timed(tmp: Path) -> None:
            t0 = time.monotonic()
            log.info(f"building {what}")
            make(tmp)
            self.timings[what] = round(time.monotonic() - t0, 1)
            log.info(f"built {what} in {time.monotonic() - t0:.0f}s")
        return timed

    def rootfs(self, spec: Rootfs) -> Path:
        """A cached rootfs tarball (mmdebstrap, variant essential)."""
        out = cache_dir() / "rootfs" / f"{spec.name}-{spec.key()[:16]}.tar"
        return produce_file(out, self._timed(f"rootfs:{spec.name}", lambda tmp: make_rootfs(spec, tmp)), self.force)

    def go_inputs(self) -> str:
        if self._go_inputs is None:
            kb = kube.KUBE_BUILD
            self._go_inputs = digest((kb / "go.mod").read_bytes(), (kb / "go.sum").read_bytes(), kube.go_version())
        return self._go_inputs

    def go_binary(self, pkg: str, name: str) -> Path:
        """``go build`` of ``pkg`` in the kube-build module (static), cached by its inputs."""
        out = cache_dir() / "bin" / f"{name}-{digest('go', pkg, self.go_inputs())[:16]}"

        def build(tmp: Path) -> None:
            run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(tmp), pkg], cwd=kube.pinned_module(),
                env={**os.environ, "CGO_ENABLED": "0"}, timeout=3600, what=f"go build {name}")
        return produce_file(out, self._timed(f"go:{name}", build), self.force)

    def deb(self, package: str) -> Path:
        """A Debian package file (``apt-get download``, cached)."""
        d = cache_dir() / "debs"
        d.mkdir(parents=True, exist_ok=True)
        found = sorted(d.glob(f"{package}_*.deb"))
        if found and not self.force:
            return found[-1]
        with lock(f"e2eimages-deb-{package}"):
            for attempt in (1, 2):
                try:
                    run(["apt-get", "download", "-q", package], cwd=d, timeout=600, what=f"apt-get download {package}")
                    break
                except BuildError:
                    if attempt == 2:
                        raise
                    log.info("apt-get download failed; apt-get update and retry")
                    run(["apt-get", "update", "-q"], timeout=600, what="apt-get update")
        return sorted(d.glob(f"{package}_*.deb"))[-1]

    # -- images
    def ensure(self, ident: str) -> str | None:
        """Build ``ident`` (a manifest ImageID name) unless cached; returns its
        tag, or None when it cannot be made here."""
        if ident in self.built:
            return self.built[ident]
        if ident in self.skipped:
            return None
        recipe = RECIPES.get(ident)
        if recipe is None:
            self.skipped[ident] = "no local recipe"
            return None
        tag = self.tag(ident)
        t0 = time.monotonic()
        try:
            made = recipe(self, ident, tag)
        except BuildError as e:
            log.error(f"{ident} ({tag}): {e}")
            raise
        if made is None:
            return None
        self.built[ident] = tag
        self.timings.setdefault(f"image:{ident}", round(time.monotonic() - t0, 1))
        return tag

    def fresh(self, tag: str, h: str) -> bool:
        if self.force:
            return False
        return image_hash(tag) == h

    def labels(self, ident: str) -> dict[str, str]:
        """The labels besides the input hash."""
        ref = self.refs.get(ident)
        out = {"harness.k8s.io/e2e-image": ident}
        if ref:
            out["harness.k8s.io/upstream"] = ref.upstream
        return out

    def image(self, ident: str, tag: str, h: str, make: Callable[[], None]) -> str:
        """``tag`` with input hash ``h``: ``make()`` builds it unless it is fresh."""
        self.hashes[ident] = h
        if self.fresh(tag, h):
            log.info(f"{tag}: up to date")
            return tag
        with lock(f"e2eimages-image-{ident}"):
            if not self.fresh(tag, h):
                t0 = time.monotonic()
                make()
                log.info(f"built {tag} in {time.monotonic() - t0:.1f}s")
        return tag

    def base(self, spec: Rootfs) -> tuple[str, str]:
        """A local base image imported from a cached rootfs: (tag, hash)."""
        h = digest("base", spec.key())
        tag = f"{self.registry}/e2e-base/{spec.name}:{h[:12]}"

        def make() -> None:
            docker_import(self.rootfs(spec), tag, h, [BASE_PATH])
            _untag_others(tag)
        return self.image(f"base-{spec.name}", tag, h, make), h

    def from_dockerfile(self, ident: str, tag: str, h: str, dockerfile: str, files: dict | None = None) -> str:
        return self.image(ident, tag, h, lambda: _docker_build(tag, dockerfile, files or {},
                                                               {INPUT_HASH_LABEL: h, **self.labels(ident)}))

    def build(self, idents: Iterable[str] = CONFORMANCE_IMAGES) -> dict[str, str]:
        """Build the images this release's manifest has; returns ImageID -> local tag for those made."""
        idents = [i for i in idents if i in self.refs]
        for ident in idents:
            self.ensure(ident)
        for ident, why in self.skipped.items():
            log.warning(f"e2e image {ident} not built: {why}")
        return {i: self.built[i] for i in idents if i in self.built}


def _docker_build(tag: str, dockerfile: str, files: dict[str, bytes | Path | tuple[bytes | Path, int]],
                  labels: dict[str, str]) -> None:
    """``docker build`` of a context holding ``dockerfile`` and ``files`` (name -> content or (content, mode))."""
    with tempfile.TemporaryDirectory(prefix="kh-e2eimg-") as d:
        ctx = Path(d)
        (ctx / "Dockerfile").write_text(dockerfile)
        for name, src in files.items():
            src, mode = src if isinstance(src, tuple) else (src, 0o644)
            dst = ctx / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(src, Path):
                shutil.copyfile(src, dst)
            else:
                dst.write_bytes(src)
            os.chmod(dst, mode)
        docker_build(tag, ctx, labels)


def _untag_others(tag: str) -> None:
    """Drop older tags of a base image (their children keep the layers)."""
    for other in image_tags(tag.rsplit(":", 1)[0]):
        if other != tag:
            with contextlib.suppress(BuildError):  # docker refuses while something uses it
                run(["docker", "rmi", other], what=f"untag {other}")


def build_e2e_images(version: str | None = None, images: Iterable[str] = CONFORMANCE_IMAGES, *,
                     registry: str = REGISTRY, force: bool = False) -> dict[str, str]:
    """Build (or reuse) the e2e images; returns ImageID -> local tag."""
    b = Builder(version, registry, force)
    t0 = time.monotonic()
    out = b.build(tuple(images))
    log.info(f"e2e images ready in {time.monotonic() - t0:.1f}s: {', '.join(sorted(out.values()))}")
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m harness.build.e2eimages", description=__doc__.split("\n")[0])
    ap.add_argument("--version", default=None, help="k8s.io/kubernetes version (default: the kube-build module's)")
    ap.add_argument("--images", default="conformance",
                    help="conformance, smoke or a comma separated list of manifest ImageIDs")
    ap.add_argument("--registry", default=REGISTRY)
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    ap.add_argument("--repo-list", default=None, help="also write the KUBE_TEST_REPO_LIST file here")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    ids = {"conformance": CONFORMANCE_IMAGES, "smoke": SMOKE_IMAGES}.get(a.images) or \
        tuple(x.strip() for x in a.images.split(",") if x.strip())
    tags = build_e2e_images(a.version, ids, registry=a.registry, force=a.force)
    p = write_repo_list(a.repo_list, a.registry)
    print(json.dumps({"images": tags, "repo_list": str(p)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
