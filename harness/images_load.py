"""Put local Docker images into every node's containerd, like
``kind load docker-image``: ``docker save`` the tags and stream the archive
into ``ctr -n k8s.io images import --platform <the node's> -`` on each
machine (one platform only), then check with ``crictl`` on every node that
the kubelet sees each image under its tag with the Docker image's ID.

Provider-agnostic: it only uses the provider's Exec capability (``exec``
with stdin), so any provider whose machines run containerd works.  Nodes
that already have an image (same tag, same image ID: the config digest of
the tag's manifest in containerd) are skipped.
"""
from __future__ import annotations

import json
import logging
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Sequence

from providers.base import Machine

log = logging.getLogger("harness.images")

CTR_NAMESPACE = "k8s.io"
_SNAPSHOTTER_AND_ARCH_CMD = ("sed -n -E 's/^[[:space:]]*snapshotter[[:space:]]*=[[:space:]]*\"([^\"]+)\".*/\\1/p' "
                    "/etc/containerd/config.toml 2>/dev/null | head -1; uname -m")
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}


class ImageLoadError(RuntimeError):
    pass


def normalize(ref: str) -> str:
    """The name containerd stores for a docker reference (docker.io/library/...)."""
    name, sep, digest = ref.partition("@")
    if ":" in name.rsplit("/", 1)[-1]:
        name, tag = name.rsplit(":", 1)
    else:
        tag = "" if sep else "latest"
    first = name.split("/")[0]
    if "/" not in name:
        name = f"docker.io/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    return name + (f":{tag}" if tag else "") + (f"@{digest}" if sep else "")


def image_ids(tags: Iterable[str]) -> dict[str, str]:
    """tag -> docker image ID (sha256:... of the config, which is also the
    CRI image ID once imported)."""
    out = {}
    for t in tags:
        p = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", t], capture_output=True, text=True)
        if p.returncode != 0:
            raise ImageLoadError(f"no local docker image {t!r}: {p.stderr.strip()}")
        out[t] = p.stdout.strip()
    return out


_CONFIGS_SCRIPT = r"""
ns="$1"; shift
for r in "$@"; do
  d=$(ctr -n "$ns" images ls "name==$r" 2>/dev/null | awk 'NR==2{print $3}')
  [ -n "$d" ] || continue
  printf '@@REF %s\n' "$r"
  ctr -n "$ns" content get "$d"
  printf '\n'
done
"""


def node_image_configs(cluster, machine: Machine, refs: Sequence[str],
                       namespace: str = CTR_NAMESPACE) -> dict[str, str]:
    """containerd ref -> image config digest (= the docker image ID) for
    those of ``refs`` the machine has."""
    res = cluster.provider.exec(machine, ["sh", "-c", _CONFIGS_SCRIPT, "sh", namespace, *refs], check=False,
                                timeout=300)
    if res.exit_code != 0:
        raise ImageLoadError(f"{machine.name}: listing images failed: {(res.stderr or res.stdout).strip()[-500:]}")
    out: dict[str, str] = {}
    for chunk in res.stdout.split("@@REF ")[1:]:
        ref, _, body = chunk.partition("\n")
        try:
            manifest = json.loads(body)
        except ValueError:
            continue
        if "manifests" in manifest:  # an index: take the linux/amd64 (or only) manifest
            ms = manifest["manifests"]
            pick = next((m for m in ms if m.get("platform", {}).get("architecture") == "amd64"), ms[0] if ms else None)
            if not pick:
                continue
            got = cluster.provider.exec(machine, ["ctr", "-n", namespace, "content", "get", pick["digest"]],
                                        check=False, timeout=60)
            try:
                manifest = json.loads(got.stdout)
            except ValueError:
                continue
        cfg = manifest.get("config", {}).get("digest")
        if cfg:
            out[ref.strip()] = cfg
    return out


def missing_on(configs: dict[str, str], ids: dict[str, str]) -> list[str]:
    """The tags of ``ids`` (tag -> docker image ID) that a node with
    ``configs`` (containerd ref -> config digest) lacks or has as another image."""
    return [tag for tag, iid in ids.items() if configs.get(normalize(tag)) != iid]


def _save(tags: Sequence[str]) -> bytes:
    with tempfile.TemporaryDirectory(prefix="kh-load-") as d:
        path = Path(d) / "images.tar"
        p = subprocess.run(["docker", "save", "-o", str(path), *tags], capture_output=True, text=True)
        if p.returncode != 0:
            raise ImageLoadError(f"docker save {' '.join(tags)}: {p.stderr.strip()}")
        return path.read_bytes()


def _import(cluster, machine: Machine, archive: bytes, namespace: str, timeout: float) -> None:
    *snap, machine_arch = cluster.provider.exec(machine, ["sh", "-c", _SNAPSHOTTER_AND_ARCH_CMD], check=False,
                                                timeout=60).stdout.split() or ["x86_64"]
    arch = _ARCH.get(machine_arch, machine_arch)
    cmd = ["ctr", "-n", namespace, "images", "import", "--platform", f"linux/{arch}"]
    if snap:
        cmd.append(f"--snapshotter={snap[0]}")
    res = cluster.provider.exec(machine, cmd + ["-"], input=archive, check=False, timeout=timeout)
    if res.exit_code != 0:
        raise ImageLoadError(f"{machine.name}: {' '.join(cmd)} exited {res.exit_code}: "
                             f"{(res.stderr or res.stdout).strip()[-1500:]}")


def cri_missing(cluster, machine: Machine, ids: dict[str, str]) -> list[str]:
    """The tags of ``ids`` (tag -> docker image ID) that ``crictl images`` on
    ``machine`` does not list under that tag with that ID (what the kubelet sees)."""
    res = cluster.provider.exec(machine, ["crictl", "images", "-o", "json"], check=False, timeout=120)
    if res.exit_code != 0:
        raise ImageLoadError(f"{machine.name}: crictl images failed: {(res.stderr or res.stdout).strip()[-500:]}")
    seen = {(tag, img["id"]) for img in json.loads(res.stdout).get("images", []) for tag in img.get("repoTags") or []}
    return [t for t, iid in ids.items() if (normalize(t), iid) not in seen]


def load_images(cluster, tags: Iterable[str], *, machines: Sequence[Machine] | None = None,
                namespace: str = CTR_NAMESPACE, parallel: int = 3, timeout: float = 900) -> dict[str, list[str]]:
    """Import ``tags`` (local docker images) into the containerd of every
    machine of ``cluster`` that lacks them.  Returns machine -> tags loaded."""
    tags = list(dict.fromkeys(tags))
    if not tags:
        return {}
    machines = list(machines if machines is not None else cluster.machines())
    ids = image_ids(tags)
    t0 = time.monotonic()

    refs = [normalize(t) for t in ids]

    def plan(m: Machine) -> tuple[Machine, list[str]]:
        return m, missing_on(node_image_configs(cluster, m, refs, namespace), ids)

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        todo = [x for x in pool.map(plan, machines)]
    groups: dict[tuple[str, ...], list[Machine]] = {}
    for m, miss in todo:
        if miss:
            groups.setdefault(tuple(miss), []).append(m)
        else:
            log.info(f"{m.name}: all {len(tags)} images present", extra={"machine": m.name, "phase": "load-images"})
    loaded: dict[str, list[str]] = {m.name: [] for m in machines}
    for miss, ms in groups.items():
        archive = _save(miss)
        log.info(f"loading {len(miss)} images ({len(archive) >> 20} MiB) into {', '.join(m.name for m in ms)}",
                 extra={"phase": "load-images", "cluster": getattr(cluster, "name", "")})

        def one(m: Machine, miss=miss, archive=archive) -> None:
            t1 = time.monotonic()
            _import(cluster, m, archive, namespace, timeout)
            still = missing_on(node_image_configs(cluster, m, [normalize(t) for t in miss], namespace),
                               {t: ids[t] for t in miss})
            if still:
                raise ImageLoadError(f"{m.name}: images still missing after import: {still}")
            loaded[m.name] = list(miss)
            log.info(f"{m.name}: imported {len(miss)} images in {time.monotonic() - t1:.1f}s",
                     extra={"machine": m.name, "phase": "load-images"})

        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            for f in [pool.submit(one, m) for m in ms]:
                f.result()
    if namespace == CTR_NAMESPACE:  # what the kubelet sees, on every node
        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            for m, still in zip(machines, pool.map(lambda m: cri_missing(cluster, m, ids), machines)):
                if still:
                    raise ImageLoadError(f"{m.name}: crictl does not list {still} with the local image IDs")
    log.info(f"images on {len(machines)} machines in {time.monotonic() - t0:.1f}s",
             extra={"phase": "load-images", "cluster": getattr(cluster, "name", "")})
    return loaded
