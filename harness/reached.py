"""Machines the harness did not make, reached through the provider that knows
their ``spec.providerID`` (:func:`providers.registry.machine_access`).

* :class:`ReachedMachines` - exec, files, logs, stop and start, delegated per
  machine (the Machines and Exec capabilities); making or deleting machines and
  infrastructure is someone else's job, so it has no Provisioning or Cleanup;
* :class:`NodeMachines` - the machines of any cluster, from its Nodes (a
  cluster given by kubeconfig).

:class:`harness.capi.machines.CapiMachines` lists them from Cluster API's
Machine objects instead.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from kubernetes import client, config as kconfig

from providers import registry
from providers.base import Exec, ExecResult, Health, Machine, MachineProvider, Machines, ProviderError, require

CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"


class NoMachineAccess(ProviderError):
    """The harness cannot (or was told not to) reach this machine."""


class ReachedMachines(MachineProvider):
    """Subclasses list the machines; this reaches them (``access=False``: never)."""

    name = "reached"
    owner_hint = "whoever made the cluster"

    def __init__(self, access: bool = True) -> None:
        super().__init__({})
        self._access: dict[str, MachineProvider] = {}
        self._may_access = access

    def access(self, machine: Machine) -> MachineProvider:
        pid = machine.provider_id
        if not self._may_access:
            raise NoMachineAccess(f"{machine.name}: machine access is off (--machine-access=none)")
        if "://" not in pid:
            raise NoMachineAccess(f"{machine.name}: no spec.providerID yet (machine {machine.state})")
        name = registry.machine_access_name(pid)
        if name is None:
            raise NoMachineAccess(f"{machine.name}: no provider reaches machines with providerID scheme "
                                f"{pid.split('://')[0]!r} ({pid}); registered schemes: "
                                f"{registry.machine_access_schemes()} (entry point group {registry.ACCESS_GROUP})")
        if name not in self._access:
            self._access[name] = require(registry.get(name), Machines, Exec,
                                         needed_for=f"reaching machines with providerID {pid}")
        return self._access[name]

    def get_machine(self, name: str) -> Machine | None:
        return next((m for m in self.list_machines() if m.name == name), None)

    def exec(self, machine: Machine, cmd: Sequence[str], *, input: bytes | None = None,
             check: bool = True, timeout: float | None = None, env: Mapping[str, str] | None = None) -> ExecResult:
        return self.access(machine).exec(machine, cmd, input=input, check=check, timeout=timeout, env=env)

    def copy_to(self, machine: Machine, dest: str, data: bytes, mode: int = 0o644) -> None:
        self.access(machine).copy_to(machine, dest, data, mode)

    def copy_from(self, machine: Machine, src: str) -> bytes:
        return self.access(machine).copy_from(machine, src)

    def logs(self, machine: Machine) -> str:
        return self.access(machine).logs(machine)

    def health(self, machine: Machine) -> Health:
        return self.access(machine).health(machine)

    def stop_machine(self, machine: Machine) -> None:
        self.access(machine).stop_machine(machine)

    def start_machine(self, machine: Machine) -> Machine:
        self.access(machine).start_machine(machine)
        return self.get_machine(machine.name) or machine

    def collect_artifacts(self, machine: Machine, dest_dir: str) -> list[str]:
        try:
            return self.access(machine).collect_artifacts(machine, dest_dir)
        except ProviderError:
            return []

    def close(self) -> None:
        for p in self._access.values():
            p.close()


class NodeMachines(ReachedMachines):
    """A cluster's machines from its Nodes: name, role (the control-plane label),
    providerID, InternalIP, running while the Node is Ready."""

    name = "nodes"
    owner_hint = "the cluster's owner"

    def __init__(self, api: client.ApiClient, cluster: str = "", *, deployments: Mapping[str, str] | None = None,
                 access: bool = True):
        super().__init__(access)
        self.core = client.CoreV1Api(api)
        self.cluster = cluster
        self.deployments = dict(deployments or {})  # role -> the MachineDeployment name it is given

    def list_machines(self, cluster: str | None = None, namespace: str | None = None,
                      selector: Mapping[str, str] | None = None) -> list[Machine]:
        sel = ",".join(f"{k}={v}" for k, v in (selector or {}).items())
        out = []
        for n in self.core.list_node(label_selector=sel).items:
            labels = n.metadata.labels or {}
            ready = any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
            addrs = tuple(a.address for a in n.status.addresses or [] if a.type == "InternalIP")
            role = "control-plane" if CONTROL_PLANE_LABEL in labels else "worker"
            out.append(Machine(name=n.metadata.name, cluster=self.cluster, namespace="", role=role,
                               deployment=self.deployments.get(role, ""), provider_id=n.spec.provider_id or "",
                               state="running" if ready else "not-ready", addresses=addrs, labels=dict(labels)))
        return sorted(out, key=lambda m: m.name)


class ExistingCluster:
    """A cluster given by kubeconfig, as much of the :class:`harness.cluster.Cluster`
    handle as needs no spec: API clients, machines from its Nodes, exec on them."""

    def __init__(self, kubeconfig: str | Path, name: str = ""):
        self.kubeconfig_path = Path(kubeconfig).expanduser()
        if not self.kubeconfig_path.is_file():
            raise ProviderError(f"{kubeconfig}: no such kubeconfig file")
        self.name = name or self.kubeconfig_path.stem
        self._api: client.ApiClient | None = None
        self.provider = NodeMachines(self.api_client(), self.name)

    def api_client(self) -> client.ApiClient:
        if self._api is None:
            self._api = kconfig.new_client_from_config(str(self.kubeconfig_path))
        return self._api

    def machines(self, role: str | None = None) -> list[Machine]:
        return [m for m in self.provider.list_machines() if not role or m.role == role]

    @property
    def control_planes(self) -> list[Machine]:
        return self.machines("control-plane")
