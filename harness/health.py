"""Machine health checks and auto-repair, with Cluster API's
MachineHealthCheck semantics.

A machine is unhealthy when its provider machine is not running, its Node's
Ready condition has not been True for ``unhealthy_after`` seconds, or no
Node appeared within ``node_startup_timeout``. A Node whose machine is gone
(deleted under us) is a ghost: it is removed from the cluster (etcd member
too, for control planes) and the MachineDeployment is filled up again.

Like CAPI's ``maxUnhealthy`` and the kubeadm control plane's remediation
rules, nothing is remediated when too many machines are unhealthy at once,
control planes are repaired one at a time, and never when taking one out
would lose etcd quorum.

    with AutoRepair(controller, cluster, MachineHealthCheck(unhealthy_after=30)):
        ...  # a background loop replaces unhealthy machines
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from providers.base import Machine

from .cluster import Cluster
from .controller import MachineController

log = logging.getLogger("harness.health")


@dataclass(frozen=True)
class MachineHealthCheck:
    unhealthy_after: float = 300.0  # Ready not True for this long
    node_startup_timeout: float = 600.0  # a machine with no Node after this long
    max_unhealthy: float = 0.4  # fraction of the cluster's machines; above it nothing is remediated

    def __post_init__(self) -> None:
        for f in ("unhealthy_after", "node_startup_timeout"):
            if getattr(self, f) <= 0:
                raise ValueError(f"MachineHealthCheck.{f}: {getattr(self, f)}; allowed: > 0 seconds")
        if not 0 < self.max_unhealthy <= 1:
            raise ValueError(f"MachineHealthCheck.max_unhealthy: {self.max_unhealthy}; allowed: 0 < x <= 1")


@dataclass(frozen=True)
class Finding:
    machine: Machine
    reason: str


@dataclass
class HealthChecker:
    controller: MachineController
    cluster: Cluster
    check: MachineHealthCheck = field(default_factory=MachineHealthCheck)
    remediated: list[Finding] = field(default_factory=list)
    _first_seen: dict[str, float] = field(default_factory=dict)
    _warned: tuple = ()

    def _warn_once(self, key: tuple, msg: str) -> None:
        """A refusal is logged when the machines it is about change, not on every pass."""
        if key != self._warned:
            log.warning(msg, extra={"cluster": self.cluster.name, "phase": "health"})
            self._warned = key

    def findings(self) -> list[Finding]:
        """Unhealthy machines and ghost Nodes, with the reason."""
        now = time.monotonic()
        machines = {m.name: m for m in self.cluster.machines()}
        for name in machines:
            self._first_seen.setdefault(name, now)
        try:
            nodes = {n.metadata.name: n for n in self.cluster.core.list_node(_request_timeout=15).items}
        except Exception as e:  # no API (e.g. etcd lost quorum): the provider's view only
            log.warning(f"cannot list Nodes ({type(e).__name__}): checking machine states only",
                        extra={"cluster": self.cluster.name, "phase": "health"})
            return [Finding(m, f"machine is {m.state}") for m in machines.values() if m.state != "running"]
        out: list[Finding] = []
        for name, m in machines.items():
            node = nodes.get(name)
            if m.state != "running":
                out.append(Finding(m, f"machine is {m.state}"))
            elif node is None:
                if now - self._first_seen[name] > self.check.node_startup_timeout:
                    out.append(Finding(m, f"no Node after {self.check.node_startup_timeout:.0f}s"))
            else:
                since = _not_ready_for(node)
                if since is not None and since > self.check.unhealthy_after:
                    out.append(Finding(m, f"Node not Ready for {since:.0f}s"))
        for name, node in nodes.items():
            if name not in machines:
                out.append(Finding(_ghost(self.cluster, node), "machine is gone"))
        return out

    def remediate(self) -> list[Finding]:
        """One pass: remediate what may be remediated now; returns what was."""
        found = self.findings()
        if not found:
            return []
        # as CAPI's maxUnhealthy: out of every machine the check targets, the unhealthy ones included
        ghosts = len([f for f in found if f.machine.state == "missing"])
        total = max(len(self.cluster.machines()) + ghosts, 1)
        if len(found) / total > self.check.max_unhealthy:
            self._warn_once(("max", *sorted(f.machine.name for f in found)),
                            f"{len(found)} of {total} machines unhealthy (max {self.check.max_unhealthy:.0%}): "
                            f"not remediating: {_names(found)}")
            return []
        cps = [f for f in found if f.machine.role == "control-plane"]
        allowed = [f for f in found if f.machine.role != "control-plane"]
        if cps:
            cp_md = next(d for d in self.cluster.deployments.values() if d.role == "control-plane")
            healthy = len([m for m in self.cluster.control_planes if m.state == "running"]) - \
                len([f for f in cps if f.machine.state == "running"])
            if healthy >= cp_md.replicas // 2 + 1:
                allowed.append(cps[0])  # one control plane at a time, as KCP
            else:
                self._warn_once(("quorum", cps[0].machine.name),
                                f"control plane {cps[0].machine.name} unhealthy ({cps[0].reason}) but {healthy} "
                                f"of {cp_md.replicas} members healthy: remediation would lose etcd quorum")
        for f in allowed:
            log.info(f"remediating {f.machine.name}: {f.reason}",
                     extra={"cluster": self.cluster.name, "machine": f.machine.name, "phase": "remediate"})
            self.controller.delete_machine(self.cluster, f.machine)
            self._first_seen.pop(f.machine.name, None)
        if allowed:
            self.controller.reconcile(self.cluster)
            self.remediated.extend(allowed)
        return allowed


class AutoRepair:
    """A background loop of :class:`HealthChecker` passes (a context manager).
    Errors of a pass are logged and kept in ``errors``; the loop goes on."""

    def __init__(self, controller: MachineController, cluster: Cluster,
                 check: MachineHealthCheck | None = None, interval: float = 5.0):
        self.checker = HealthChecker(controller, cluster, check or MachineHealthCheck())
        self.interval = interval
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"auto-repair-{cluster.name}", daemon=True)

    @property
    def remediated(self) -> list[Finding]:
        return self.checker.remediated

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.checker.remediate()
            except Exception as e:
                self.errors.append(e)
                log.warning(f"health check pass failed: {type(e).__name__}: {e}",
                            extra={"cluster": self.checker.cluster.name, "phase": "health"})
            self._stop.wait(self.interval)

    def __enter__(self) -> "AutoRepair":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=900)  # a remediation in flight finishes first


def _not_ready_for(node) -> float | None:
    """Seconds since Ready left True, or None while it is True."""
    for c in node.status.conditions or []:
        if c.type == "Ready":
            if c.status == "True":
                return None
            t = c.last_transition_time
            return (datetime.now(timezone.utc) - t).total_seconds() if t else 0.0
    return 0.0  # no Ready condition yet


def _ghost(cluster: Cluster, node) -> Machine:
    """A stand-in Machine for a Node whose machine no longer exists."""
    labels = node.metadata.labels or {}
    role = "control-plane" if "node-role.kubernetes.io/control-plane" in labels else "worker"
    ips = tuple(a.address for a in (node.status.addresses or []) if a.type == "InternalIP")
    return Machine(name=node.metadata.name, cluster=cluster.name, namespace=cluster.namespace, role=role,
                   deployment="", provider_id=node.spec.provider_id or "", state="missing", addresses=ips)


def _names(found: list[Finding]) -> str:
    return ", ".join(f"{f.machine.name} ({f.reason})" for f in found)
