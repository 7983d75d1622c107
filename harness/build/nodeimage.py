"""The Kubernetes node image: the provider's base image plus kubeadm,
kubelet, kubectl, crictl (the same minor, :mod:`harness.versions`) and every
image kubeadm needs preloaded into containerd (namespace k8s.io), as kind's
pkg/build/nodeimage does.

A build container runs from the base image with containerd only (no
systemd), imports the saved images with ``--no-unpack`` (the CRI plugin
unpacks on first use), and is committed with the base image's entrypoint.
The base image must not declare VOLUME /var, or the preloaded content would
not be committed; machines get a named /var volume, which Docker fills from
the image on first mount.

The image also meets kind's node-image contract (:mod:`.kind`): /kind/version,
the default CNI and storage manifests under /kind/manifests, their images
preloaded, so ``kind create cluster --image <node image>`` runs it.
"""
from __future__ import annotations

import contextlib
import json
import tarfile
import tempfile
import uuid
from pathlib import Path

from providers.base import NodeImages

from ..progress import phase
from .. import versions
from ..spec import SpecError
from . import images, kind, kube, runtime
from .cache import (INPUT_HASH_LABEL, BuildError, digest, image_config, image_fresh, image_id, image_labels, lock,
                    log, run, tar_add)

REPOSITORY = "kube-harness/node"
RECIPE = "node-v4"  # v3: containerd 2 (pinned_images.sandbox), crictl; v4: kind's contract (/kind)


def base_image() -> str:
    from providers.docker.nodeimage.base import build_base_image
    return build_base_image(volume_var=False)


def _image_id(tag: str) -> str:
    i = image_id(tag)
    if i is None:
        raise BuildError(f"image {tag} not found")
    return i


def node_image_tag(version: str, base: str, kube_dir: Path, image_tags: list[str],
                   crictl_dir: Path, files: dict[str, str] | None = None) -> tuple[str, str]:
    """The tag and input hash: recipe, version, base image, binaries, the
    preloaded images' ids and the files written into the image (``files``)."""
    h = digest(RECIPE, version, _image_id(base), kube_dir.name, crictl_dir.name,
               sorted(f"{t}@{_image_id(t)}" for t in image_tags), sorted((files or {}).items()))
    return f"{REPOSITORY}:{version}-{h[:12]}", h


def sandbox_image(tags: list[str]) -> str:
    """The pause tag among kubeadm's images (what containerd runs as the pod sandbox)."""
    pause = [t for t in tags if t.rsplit(":", 1)[0].rsplit("/", 1)[-1] == "pause"]
    if len(pause) != 1:
        raise BuildError(f"expected exactly one pause image among {tags}, found {pause}")
    return pause[0]


def image_problem(image: str) -> str | None:
    """Why ``image`` cannot be a prebuilt node image (None when it exists locally)."""
    if image_labels(image) is None:
        return "an image in `docker images` (load or pull it first), or leave it unset to build one"
    return None


def check_option(image: str | None, provider: object) -> None:
    """--node-image: SpecError when the provider says the image cannot boot its
    machines (the Docker provider: it must exist locally)."""
    if image and isinstance(provider, NodeImages) and (why := provider.node_image_problem(image)):
        raise SpecError("--node-image", image, why)


def check_image(image: str) -> str:
    """A prebuilt node image the user named: it must exist locally."""
    why = image_problem(image)
    if why:
        raise BuildError(f"node image {image!r} not found locally; allowed: {why}")
    return image


def build_node_image(version: str | None = None, base: str | None = None, *, extra_images: list[str] = (),
                     image: str | None = None) -> str:
    if image:
        return check_image(image)
    version = version or kube.default_version()
    kube_dir = kube.build_kubernetes(version)
    components = images.build_component_images(version, kube_dir)
    pause = sandbox_image(components)
    kind_files, kind_images = kind.node_contract(version, components)
    tags = list(dict.fromkeys(components + kind_images + list(extra_images)))
    base = base or base_image()
    crictl_dir = runtime.build_crictl(versions.release(version).crictl)
    tag, h = node_image_tag(version, base, kube_dir, tags, crictl_dir, kind_files)
    if image_fresh(tag, h):
        log.info(f"node image {tag}: cached", extra={"phase": "node-image"})
        return tag
    with lock(f"node-{tag.split(':')[1]}"), phase("node-image", machine=version):
        if image_fresh(tag, h):
            return tag
        _build(tag, h, base, kube_dir, crictl_dir, tags, version, pause, kind_files)
    return tag


def _copy_files(container: str, files: dict[str, str]) -> None:
    """Write ``files`` (absolute path -> text) into the container (one tar stream)."""
    with tempfile.TemporaryFile() as buf:
        with tarfile.open(fileobj=buf, mode="w") as tf:
            dirs = sorted({p for f in files for p in Path(f.lstrip("/")).parents if str(p) != "."})
            for d in dirs:
                tar_add(tf, str(d), dir=True, mode=0o755)
            for f, text in sorted(files.items()):
                tar_add(tf, f.lstrip("/"), data=text.encode())
        buf.seek(0)
        run(["docker", "cp", "-", f"{container}:/"], stdin=buf, what=f"copy {sorted(files)} into {container}")


def _build(tag: str, h: str, base: str, kube_dir: Path, crictl_dir: Path, tags: list[str], version: str,
           pause: str, files: dict[str, str]) -> None:
    name = f"kh-nodeimage-build-{uuid.uuid4().hex[:6]}"
    cfg = image_config(base)
    if "/var" in (cfg.get("Volumes") or {}):
        raise BuildError(f"base image {base} declares VOLUME /var: preloaded images would be lost; "
                         f"build it with volume_var=False")
    run(["docker", "run", "-d", "--name", name, "--entrypoint", "sleep", base, "infinity"], what="build container")
    try:
        for b in ("kubeadm", "kubelet", "kubectl"):
            run(["docker", "cp", str(kube_dir / "bin" / b), f"{name}:/usr/bin/{b}"], what=f"copy {b}")
        run(["docker", "cp", str(crictl_dir / "bin" / "crictl"), f"{name}:/usr/local/bin/crictl"], what="copy crictl")
        _copy_files(name, files)  # kind's /kind/version and default manifests
        # containerd's CRI sandbox image must be the pause tag kubeadm of *this* version lists
        # (e.g. 3.10.1 for v1.35, 3.10.2 for v1.36), or every pod sandbox would try to pull it
        run(["docker", "exec", name, "/usr/local/bin/kh-sandbox-image.sh", pause], what="set sandbox image")
        run(["docker", "exec", name, "sh", "-c",
             f"mkdir -p /etc/kube-harness && echo {version} > /etc/kube-harness/version && "
             "mkdir -p /var/lib/containerd /run/containerd && "
             "(containerd --log-level warn >/tmp/containerd.log 2>&1 &) && "
             "for i in $(seq 1 60); do ctr version >/dev/null 2>&1 && break; sleep 0.5; done && ctr version >/dev/null"],
            what="start containerd")
        with tempfile.TemporaryDirectory(prefix="kh-node-") as d:
            tar = images.save_images(tags, Path(d) / "images.tar")
            with phase("preload-images", machine=version):
                with open(tar, "rb") as f:
                    run(["docker", "exec", "-i", name, "ctr", "-n", "k8s.io", "images", "import", "--all-platforms",
                         "--no-unpack", "--digests", "-"], stdin=f, what="ctr images import")
        listed = run(["docker", "exec", name, "ctr", "-n", "k8s.io", "images", "ls", "-q"], what="ctr ls").split()
        missing = [t for t in tags if t not in listed and f"docker.io/{t}" not in listed]
        if missing:
            raise BuildError(f"images missing from the node's containerd after import: {missing}")
        # kubelet image GC must never remove the sandbox image (kind sets the same label)
        run(["docker", "exec", name, "ctr", "-n", "k8s.io", "images", "label", pause,
             "io.cri-containerd.pinned=pinned"], what="pin sandbox image")
        run(["docker", "exec", name, "sh", "-c", "pkill containerd; for i in $(seq 1 40); do "
             "pgrep containerd >/dev/null || break; sleep 0.25; done; rm -rf /tmp/* /run/containerd"],
            what="stop containerd")
        changes = [f"ENTRYPOINT {json.dumps(cfg.get('Entrypoint') or [])}", f"CMD {json.dumps(cfg.get('Cmd') or [])}",
                   f"LABEL {INPUT_HASH_LABEL}={h}", f"LABEL harness.k8s.io/kubernetes-version={version}"]
        # STOPSIGNAL is not a commit change in Docker 20.10; the container inherits the base's
        cmd = ["docker", "commit"]
        for c in changes:
            cmd += ["--change", c]
        run(cmd + [name, tag], what="docker commit")
        log.info(f"built node image {tag} with {len(tags)} preloaded images", extra={"phase": "node-image"})
    finally:
        with contextlib.suppress(BuildError):
            run(["docker", "rm", "-f", name], what="remove the build container")
