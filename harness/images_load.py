"""Put local Docker images into every node's containerd, like
``kind load docker-image``: ``docker save`` the tags and stream the archive
into ``ctr -n k8s.io images import -`` on each machine.

Provider-agnostic: it only uses the MachineProvider interface (``exec``
with stdin), so any provider whose machines run containerd works.  Nodes
that already have an image (same tag and same image ID) are skipped.
"""
from __future__ import annotations

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
_SNAPSHOTTER_CMD = ("sed -n -E 's/^[[:space:]]*snapshotter[[:space:]]*=[[:space:]]*\"([^\"]+)\".*/\\1/p' "
                    "/etc/containerd/config.toml 2>/dev/null | head -1")


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


def node_images(cluster, machine: Machine, namespace: str = CTR_NAMESPACE) -> set[str]:
    res = cluster.provider.exec(machine, ["ctr", "-n", namespace, "images", "ls", "-q"], check=False, timeout=120)
    if res.exit_code != 0:
        raise ImageLoadError(f"{machine.name}: ctr images ls failed: {(res.stderr or res.stdout).strip()[-500:]}")
    return set(res.stdout.split())


def missing_on(refs: set[str], ids: dict[str, str]) -> list[str]:
    """The tags of ``ids`` a node with ``refs`` lacks.  The CRI plugin adds
    an image-ID reference for every image it knows; when it does, a tag that
    points at another (older) image counts as missing."""
    has_id_refs = any(r.startswith("sha256:") for r in refs)
    out = []
    for tag, iid in ids.items():
        if normalize(tag) not in refs or (has_id_refs and iid not in refs):
            out.append(tag)
    return out


def _save(tags: Sequence[str]) -> bytes:
    with tempfile.TemporaryDirectory(prefix="kh-load-") as d:
        path = Path(d) / "images.tar"
        p = subprocess.run(["docker", "save", "-o", str(path), *tags], capture_output=True, text=True)
        if p.returncode != 0:
            raise ImageLoadError(f"docker save {' '.join(tags)}: {p.stderr.strip()}")
        return path.read_bytes()


def _import(cluster, machine: Machine, archive: bytes, namespace: str, timeout: float) -> None:
    snap = cluster.provider.exec(machine, ["sh", "-c", _SNAPSHOTTER_CMD], check=False, timeout=60).stdout.strip()
    cmd = ["ctr", "-n", namespace, "images", "import", "--all-platforms"]
    if snap:
        cmd.append(f"--snapshotter={snap}")
    res = cluster.provider.exec(machine, cmd + ["-"], input=archive, check=False, timeout=timeout)
    if res.exit_code != 0:
        raise ImageLoadError(f"{machine.name}: {' '.join(cmd)} exited {res.exit_code}: "
                             f"{(res.stderr or res.stdout).strip()[-1500:]}")


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

    def plan(m: Machine) -> tuple[Machine, list[str]]:
        return m, missing_on(node_images(cluster, m, namespace), ids)

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
            still = missing_on(node_images(cluster, m, namespace), {t: ids[t] for t in miss})
            if still:
                raise ImageLoadError(f"{m.name}: images still missing after import: {still}")
            loaded[m.name] = list(miss)
            log.info(f"{m.name}: imported {len(miss)} images in {time.monotonic() - t1:.1f}s",
                     extra={"machine": m.name, "phase": "load-images"})

        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            for f in [pool.submit(one, m) for m in ms]:
                f.result()
    log.info(f"images on {len(machines)} machines in {time.monotonic() - t0:.1f}s",
             extra={"phase": "load-images", "cluster": getattr(cluster, "name", "")})
    return loaded
