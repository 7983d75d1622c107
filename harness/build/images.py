"""Control-plane, kube-proxy, etcd, CoreDNS and pause images, built locally
(``docker import`` of minimal rootfs tarballs) and tagged exactly as
``kubeadm config images list`` prints for the version, so kubeadm finds
them preloaded and never pulls."""
from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from ..progress import phase
from . import components, kube
from .cache import (BuildError, cache_dir, digest, docker_build, docker_import, file_digest, image_fresh, lock, log,
                    run, tar_add)

IPTABLES_PACKAGES = ("iptables", "conntrack", "kmod", "ipset", "ebtables")
# Picks the iptables backend the node's kubelet uses, as upstream's iptables-wrapper does.
IPTABLES_WRAPPER = """#!/bin/sh
case "${0##*/}" in iptables-wrapper) echo "usage: run as iptables, iptables-save, ... (symlinks)" >&2; exit 2;; esac
mode=nft
if iptables-legacy-save -t mangle 2>/dev/null | grep -q KUBE-IPTABLES-HINT; then mode=legacy; fi
if iptables-nft-save -t mangle 2>/dev/null | grep -q KUBE-IPTABLES-HINT; then mode=nft; fi
for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
  ln -sf "/usr/sbin/xtables-$mode-multi" "/usr/sbin/$t"
done
exec "$0" "$@"
"""


def _etc_files(tf: tarfile.TarFile) -> None:
    for d in ("etc", "tmp", "usr", "usr/local", "usr/local/bin", "var", "var/run", "run", "etc/ssl", "etc/ssl/certs"):
        tar_add(tf, d, dir=True, mode=0o1777 if d == "tmp" else 0o755)
    tar_add(tf, "etc/passwd", data=b"root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n")
    tar_add(tf, "etc/group", data=b"root:x:0:\nnobody:x:65534:\n")
    tar_add(tf, "etc/nsswitch.conf", data=b"hosts: files dns\n")
    ca = Path("/etc/ssl/certs/ca-certificates.crt")
    if ca.exists():
        tar_add(tf, "etc/ssl/certs/ca-certificates.crt", data=ca.read_bytes())


def binary_image(tag: str, files: dict[str, Path], entrypoint: list[str], h: str, user: str = "") -> str:
    """``tag``: ``files`` (rootfs path -> binary) on a minimal /etc, imported
    with ``entrypoint``; built unless the image's input-hash label is ``h``."""
    if image_fresh(tag, h):
        return tag
    with tempfile.TemporaryDirectory(prefix="kh-img-") as d:
        tar = Path(d) / "rootfs.tar"
        with tarfile.open(tar, "w") as tf:
            _etc_files(tf)
            for dest, src in files.items():
                tar_add(tf, dest, data=src.read_bytes(), mode=0o755)
        changes = ["ENV PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                   "ENTRYPOINT " + str(entrypoint).replace("'", '"')]
        if user:
            changes.append(f"USER {user}")
        docker_import(tar, tag, h, changes)
    log.info(f"built {tag}", extra={"phase": "images"})
    return tag


def _iptables_base() -> str:
    """A small Debian rootfs with iptables & co for kube-proxy (cached)."""
    h = digest("iptables-base-v1", IPTABLES_PACKAGES, IPTABLES_WRAPPER)
    tag = f"kube-harness/iptables-base:{h[:12]}"
    if image_fresh(tag, h):
        return tag
    with lock("iptables-base"), phase("iptables-rootfs"):
        if image_fresh(tag, h):
            return tag
        tar = cache_dir() / "rootfs" / f"iptables-{h[:12]}.tar"
        tar.parent.mkdir(parents=True, exist_ok=True)
        if not tar.exists():
            tmp = tar.with_suffix(".tmp")
            run(["mmdebstrap", "--mode=root", "--variant=essential", "--format=tar",
                 "--include=" + ",".join(IPTABLES_PACKAGES),
                 "--dpkgopt=path-exclude=/usr/share/{doc,man,locale,info}/*",
                 "bookworm", str(tmp)], what="mmdebstrap iptables rootfs")
            tmp.rename(tar)
        with tempfile.TemporaryDirectory(prefix="kh-ipt-") as d:
            out = Path(d) / "rootfs.tar"
            shutil.copyfile(tar, out)
            with tarfile.open(out, "a") as tf:
                tar_add(tf, "usr/sbin/iptables-wrapper", data=IPTABLES_WRAPPER.encode(), mode=0o755)
            docker_import(out, tag, h, ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
    return tag


def _kube_proxy_image(tag: str, binary: Path, h: str) -> str:
    if image_fresh(tag, h):
        return tag
    base = _iptables_base()
    with tempfile.TemporaryDirectory(prefix="kh-kp-") as d:
        ctx = Path(d)
        (ctx / "kube-proxy").write_bytes(binary.read_bytes())
        os.chmod(ctx / "kube-proxy", 0o755)
        (ctx / "Dockerfile").write_text(
            f"FROM {base}\nCOPY kube-proxy /usr/local/bin/kube-proxy\n"
            "RUN for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; "
            "do ln -sf /usr/sbin/iptables-wrapper /usr/sbin/$t; done\n"
            'ENTRYPOINT ["/usr/local/bin/kube-proxy"]\n'
            f"LABEL harness.k8s.io/input-hash={h}\n")
        docker_build(tag, ctx)
    log.info(f"built {tag}", extra={"phase": "images"})
    return tag


def build_component_images(version: str, kube_dir: Path | None = None) -> list[str]:
    """Build every image kubeadm needs for ``version``; returns the tags."""
    kube_dir = kube_dir or kube.build_kubernetes(version)
    bindir = kube_dir / "bin"
    wanted = kube.kubeadm_images(bindir, version)
    tags = []
    # one builder at a time per version (setup and a test session may both ask)
    with lock(f"component-images-{version}"), phase("component-images", machine=version):
        for name, tag in sorted(wanted.items()):
            ver = tag.rsplit(":", 1)[1]
            if name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
                b = bindir / name
                h = digest("cp-image-v2", tag, file_digest(b))
                tags.append(binary_image(tag, {f"usr/local/bin/{name}": b}, [f"/usr/local/bin/{name}"], h))
            elif name == "kube-proxy":
                b = bindir / name
                h = digest("kp-image-v2", tag, file_digest(b), IPTABLES_WRAPPER, IPTABLES_PACKAGES)
                tags.append(_kube_proxy_image(tag, b, h))
            elif name == "etcd":
                etcd_dir = components.build_go_component("etcd", "v" + ver.split("-")[0])
                h = digest("etcd-image-v1", tag, etcd_dir.name)
                files = {f"usr/local/bin/{b}": etcd_dir / "bin" / b for b in ("etcd", "etcdctl")
                         if (etcd_dir / "bin" / b).exists()}
                tags.append(binary_image(tag, files, ["/usr/local/bin/etcd"], h))
            elif name == "coredns":
                cd = components.build_go_component("coredns", ver)
                h = digest("coredns-image-v1", tag, cd.name)
                tags.append(binary_image(tag, {"coredns": cd / "bin" / "coredns"}, ["/coredns"], h))
            elif name == "pause":
                pd = components.build_pause(kube.module_dir(version), ver)
                h = digest("pause-image-v1", tag, pd.name)
                tags.append(binary_image(tag, {"pause": pd / "pause"}, ["/pause"], h, user="65535:65535"))
            else:
                raise BuildError(f"kubeadm {version} wants an image this harness cannot build: {tag}")
    return tags


def save_images(tags: list[str], out_tar: Path) -> Path:
    """docker save into one archive that ``ctr images import`` accepts."""
    out_tar.parent.mkdir(parents=True, exist_ok=True)
    run(["docker", "save", "-o", str(out_tar), *tags], what="docker save")
    return out_tar
