"""A machine's logs for debugging: journal (all, kubelet, containerd), docker
inspect, container log, systemd units, haproxy.cfg of a load balancer and
/var/log/pods, written below a directory. Never raises."""
from __future__ import annotations

import contextlib
import io
import json
import logging
import tarfile
from pathlib import Path
from typing import Any, Callable

from docker import errors as derr

from providers.base import Machine

from .containers import Containers
from .engine import Engine
from .loadbalancer import HAPROXY_CFG

log = logging.getLogger("harness.provider.docker")


def collect_artifacts(engine: Engine, containers: Containers, machine: Machine, dest_dir: str) -> list[str]:
    try:
        return _collect(engine, containers, machine, Path(dest_dir))
    except Exception as e:  # runs on failure paths: report, never raise
        log.warning(f"collect_artifacts {machine.name}: {type(e).__name__}: {e}")
        return []


def _collect(engine: Engine, containers: Containers, machine: Machine, out: Path) -> list[str]:
    written: list[str] = []
    try:
        engine.api.inspect_container(machine.name)
    except Exception as e:  # gone (or no engine): nothing to collect
        log.warning(f"collect_artifacts {machine.name}: {e}")
        return written
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        log.warning(f"collect_artifacts {machine.name}: {e}")
        return written

    def save(name: str, fn: Callable[[], Any]) -> None:
        try:
            data = fn()
            if data is None:
                return
            p = out / name
            p.write_bytes(data if isinstance(data, bytes) else str(data).encode())
            written.append(str(p))
        except Exception as e:
            log.debug(f"collect_artifacts {machine.name} {name}: {e}")
            with contextlib.suppress(Exception):
                (out / f"{name}.error").write_text(f"{type(e).__name__}: {e}\n")

    def run(*cmd: str) -> str | None:
        r = engine.exec(machine, list(cmd), check=False, timeout=120)
        return r.stdout + (f"\n--- stderr (exit {r.exit_code}) ---\n{r.stderr}" if r.stderr.strip() else "")

    save("inspect.json", lambda: json.dumps(engine.api.inspect_container(machine.name), indent=2))
    save("container.log", lambda: engine.logs(machine))
    running = False
    with contextlib.suppress(Exception):
        running = bool(engine.api.inspect_container(machine.name)["State"].get("Running"))
    role = machine.role or (containers.get_machine(machine.name) or machine).role
    if running and role == "load-balancer":
        save("haproxy.cfg", lambda: engine.copy_from(machine, HAPROXY_CFG))
    elif running:
        save("journal.log", lambda: run("journalctl", "--no-pager", "-o", "short-precise"))
        save("kubelet.log", lambda: run("journalctl", "--no-pager", "-o", "short-precise", "-u", "kubelet"))
        save("containerd.log", lambda: run("journalctl", "--no-pager", "-o", "short-precise", "-u", "containerd"))
        save("systemd-units.txt", lambda: run("systemctl", "list-units", "--all", "--no-pager"))
        save("failed-units.txt", lambda: run("systemctl", "--failed", "--no-pager"))
    try:
        stream, _ = engine.api.get_archive(machine.name, "/var/log/pods")
        written += _safe_extract(b"".join(stream), out)
    except derr.NotFound:
        pass
    except Exception as e:
        log.debug(f"collect_artifacts {machine.name} pods: {e}")
    return written


def _safe_extract(raw: bytes, dest: Path) -> list[str]:
    """Extract a tar (from get_archive) below dest, refusing escapes and links."""
    written = []
    root = dest.resolve()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        for ti in tf.getmembers():
            target = (root / ti.name).resolve()
            if root not in target.parents and target != root:
                continue
            if ti.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif ti.isfile():
                target.parent.mkdir(parents=True, exist_ok=True)
                f = tf.extractfile(ti)
                if f is not None:
                    target.write_bytes(f.read())
                    written.append(str(target))
    return written
