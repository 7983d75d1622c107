"""Containers as machines: created and started (free host ports picked), listed
and inspected as :class:`Machine`, their health (systemd's state), stop, start
and the host ports they publish."""
from __future__ import annotations

import contextlib
import logging
import socket
import time
from typing import Any, Callable, Mapping, Sequence

from docker import errors as derr

from providers.base import L_CLUSTER, L_DEPLOYMENT, L_NAMESPACE, L_ROLE, Health, Machine, ProviderError

from .engine import Engine
from .network import network_name

log = logging.getLogger("harness.provider.docker")
STATES = {"running": "running", "exited": "stopped", "created": "stopped", "dead": "stopped"}


def _free_port(address: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _port_conflict(e: Exception) -> bool:
    m = str(e).lower()
    return "port is already allocated" in m or "address already in use" in m or "bind for" in m


def label_filters(selector: Mapping[str, str] | None) -> dict[str, list[str]]:
    """The engine's filter for the harness's objects (any cluster) matching the label selector."""
    return {"label": [L_CLUSTER] + [f"{k}={v}" for k, v in (selector or {}).items()]}


def to_machine(c: Mapping[str, Any]) -> Machine:
    """From a container summary (list) or inspect document."""
    if "Names" in c:  # summary
        name = c["Names"][0].lstrip("/")
        labels = c.get("Labels") or {}
        status = c.get("State", "")
    else:
        name = c["Name"].lstrip("/")
        labels = c["Config"].get("Labels") or {}
        status = c["State"]["Status"]
    nets = (c.get("NetworkSettings") or {}).get("Networks") or {}
    own = network_name(labels.get(L_CLUSTER, ""), labels.get(L_NAMESPACE, ""))
    order = sorted(nets, key=lambda n: (n != own, n))
    addrs = tuple(nets[n][key] for key in ("IPAddress", "GlobalIPv6Address") for n in order if nets[n].get(key))
    return Machine(name=name, cluster=labels.get(L_CLUSTER, ""), namespace=labels.get(L_NAMESPACE, ""),
                   role=labels.get(L_ROLE, ""), deployment=labels.get(L_DEPLOYMENT, ""),
                   provider_id=f"docker:////{name}", state=STATES.get(status, status), addresses=addrs,
                   labels=dict(labels))


class Containers:
    def __init__(self, engine: Engine):
        self.engine = engine

    def find(self, selector: Mapping[str, str] | None = None) -> list[dict]:
        """Summaries of the harness's containers (any cluster) matching the label selector."""
        return self.engine.api.containers(all=True, filters=label_filters(selector))

    def list_machines(self, cluster: str | None = None, namespace: str | None = None,
                      selector: Mapping[str, str] | None = None) -> list[Machine]:
        sel = dict(selector or {})
        if cluster:
            sel[L_CLUSTER] = cluster
        if namespace:
            sel[L_NAMESPACE] = namespace
        out = [to_machine(c) for c in self.find(sel) if L_ROLE in (c.get("Labels") or {})]
        return sorted(out, key=lambda m: m.name)

    def get_machine(self, name: str) -> Machine | None:
        try:
            info = self.engine.api.inspect_container(name)
        except derr.NotFound:
            return None
        labels = info["Config"].get("Labels") or {}
        if L_CLUSTER not in labels or L_ROLE not in labels:
            return None  # not ours
        return to_machine(info)

    def create_and_start(self, name: str, image: str, network: str, ports: Sequence[tuple[str, str, int]],
                         container: dict[str, Any], host: dict[str, Any], raw_host: dict[str, Any] | None = None,
                         before_start: Callable[[str], None] | None = None, attempts: int = 5) -> str:
        """Create and start a container on ``network``; returns its id.
        Host ports given as 0 are picked here (and so stay the same across
        restarts, as kind does); a collision with another process retries."""
        api = self.engine.api
        for attempt in range(attempts):
            bindings: dict[str, tuple[str, int]] = {}
            exposed: list[tuple[int, str]] = []
            for cport, addr, hport in ports:
                bindings[cport] = (addr, hport or _free_port(addr))
                num, _, proto = cport.partition("/")
                exposed.append((int(num), proto or "tcp"))
            hc = api.create_host_config(port_bindings=bindings or None, network_mode=network, **host)
            hc.update(raw_host or {})
            nc = api.create_networking_config({network: api.create_endpoint_config(aliases=[name])})
            try:
                cid = api.create_container(image, name=name, host_config=hc, networking_config=nc,
                                           ports=exposed or None, **container)["Id"]
            except derr.ImageNotFound as e:
                raise ProviderError(f"{name}: image {image!r} not found (build it first)") from e
            except derr.APIError as e:
                if e.status_code == 409:
                    raise ProviderError(f"{name}: a container of that name already exists") from e
                raise ProviderError(f"{name}: creating container: {e.explanation or e}") from e
            try:
                if before_start is not None:
                    before_start(cid)
                api.start(cid)
                return cid
            except derr.APIError as e:
                with contextlib.suppress(derr.APIError):
                    api.remove_container(cid, force=True, v=True)
                if _port_conflict(e) and attempt < attempts - 1 and any(h == 0 for _, _, h in ports):
                    log.debug(f"{name}: host port collision, retrying: {e}")
                    continue
                raise ProviderError(f"{name}: starting container: {e.explanation or e}") from e
            except BaseException:
                with contextlib.suppress(derr.APIError):
                    api.remove_container(cid, force=True, v=True)
                raise
        raise ProviderError(f"{name}: no free host port after {attempts} attempts")

    def fresh_volume(self, name: str, labels: Mapping[str, str]) -> str:
        """Create a machine's /var volume; a leftover of a deleted machine
        with the same name is removed first (it would carry its state)."""
        api = self.engine.api
        try:
            api.inspect_volume(name)
            try:
                api.remove_volume(name)
            except derr.APIError as e:
                raise ProviderError(f"volume {name} exists and is in use: {e}") from e
        except derr.NotFound:
            pass
        api.create_volume(name, driver="local", labels=dict(labels))
        return name

    def health(self, machine: Machine) -> Health:
        try:
            info = self.engine.api.inspect_container(machine.name)
        except derr.NotFound:
            return Health(False, False, "container does not exist")
        st = info["State"]
        if not st.get("Running"):
            return Health(False, False, f"container {st.get('Status')} (exit code {st.get('ExitCode')}) "
                                        f"{st.get('Error') or ''}".strip())
        if st.get("Restarting"):
            return Health(False, False, "container restarting")
        labels = info["Config"].get("Labels") or {}
        if labels.get(L_ROLE) == "load-balancer":
            return Health(True, True, "haproxy running")
        try:
            r = self.engine.exec(machine, ["systemctl", "is-system-running"], check=False, timeout=15)
        except ProviderError as e:
            return Health(True, False, f"systemctl: {e}")
        state = r.stdout.strip() or r.stderr.strip()
        return Health(True, state in ("running", "degraded"), f"systemd {state}")

    def wait_booted(self, machine: Machine, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        last = None
        while time.monotonic() < end:
            last = self.health(machine)
            if last.booted:
                if last.detail == "systemd degraded":
                    failed = self.engine.exec(machine, ["systemctl", "--failed", "--no-legend", "--plain"], check=False)
                    log.warning(f"{machine.name}: systemd degraded: {failed.stdout.strip()}",
                                extra={"machine": machine.name})
                return
            if not last.running and "restarting" not in last.detail:
                raise ProviderError(f"{machine.name}: machine stopped while booting: {last.detail}\n"
                                    f"{self.engine.logs(machine)[-3000:]}")
            time.sleep(0.25)
        raise ProviderError(f"{machine.name}: not booted after {timeout:.0f}s: {last.detail if last else ''}\n"
                            f"{self.engine.logs(machine)[-3000:]}")

    def stop(self, machine: Machine, timeout: int) -> None:
        api = self.engine.api
        try:
            api.stop(machine.name, timeout=timeout)
        except derr.NotFound as e:
            raise ProviderError(f"{machine.name}: no such machine") from e
        # the engine answers once the container stopped, but its container list (what
        # list_machines reads) is updated a moment later, after the restart-policy check
        end = time.monotonic() + 10
        while time.monotonic() < end:
            listed = api.containers(all=True, filters={"name": f"^/{machine.name}$"})
            if not listed or listed[0].get("State") != "running":
                return
            time.sleep(0.1)
        raise ProviderError(f"{machine.name}: stopped, but still listed as running after 10s")

    def start(self, machine: Machine, boot_timeout: float) -> Machine:
        try:
            self.engine.api.start(machine.name)
        except derr.NotFound as e:
            raise ProviderError(f"{machine.name}: no such machine") from e
        except derr.APIError as e:
            raise ProviderError(f"{machine.name}: start: {e.explanation or e}") from e
        m = self.get_machine(machine.name) or machine
        self.wait_booted(m, timeout=boot_timeout)
        return self.get_machine(machine.name) or m

    def host_endpoint(self, machine: Machine, port: int) -> tuple[str, int]:
        try:
            info = self.engine.api.inspect_container(machine.name)
        except derr.NotFound as e:
            raise ProviderError(f"{machine.name}: no such machine") from e
        bindings = (info["NetworkSettings"].get("Ports") or {}).get(f"{port}/tcp") or \
            ((info["HostConfig"].get("PortBindings") or {}).get(f"{port}/tcp")) or []
        for b in bindings:
            if b.get("HostPort"):
                ip = b.get("HostIp") or "127.0.0.1"
                if ip in ("0.0.0.0", "::", ""):
                    ip = "127.0.0.1"
                return ip, int(b["HostPort"])
        return machine.ip, port
