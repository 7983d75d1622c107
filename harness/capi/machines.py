"""A workload cluster's machines as the harness's tests see them.

Cluster API owns these machines: they are listed from the management
cluster's ``Machine`` objects (role, MachineDeployment, Node name, phase)
and reached through the provider whose ``spec.providerID`` scheme they carry
(:func:`providers.registry.machine_access`; CAPD's ``docker://`` machines
are containers the harness's Docker provider can exec into, stop and start).
Creating machines is the controllers' job: scale the KubeadmControlPlane or
MachineDeployment instead (:mod:`.controller`).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from kubernetes import client

from providers import registry
from providers.base import ExecResult, Health, Machine, MachineProvider, MachineSpec, Owner, ProviderError

CAPI_GROUP, CAPI_VERSION = "cluster.x-k8s.io", "v1beta2"
L_CLUSTER_NAME = "cluster.x-k8s.io/cluster-name"
L_CONTROL_PLANE = "cluster.x-k8s.io/control-plane"
L_DEPLOYMENT = "cluster.x-k8s.io/deployment-name"
L_TOPOLOGY_DEPLOYMENT = "topology.cluster.x-k8s.io/deployment-name"
#: Machine phase -> the harness's machine state
STATES = {"Running": "running", "Provisioned": "provisioning", "Provisioning": "provisioning",
          "Pending": "provisioning", "Deleting": "deleting", "Deleted": "missing", "Failed": "failed"}


def deployment_of(cluster: str, labels: Mapping[str, str]) -> str:
    """The harness's MachineDeployment name for a Machine (``<cluster>-control-plane``,
    ``<cluster>-<topology md name>``), as :func:`harness.spec.parse` names them."""
    if L_CONTROL_PLANE in labels:
        return f"{cluster}-control-plane"
    if labels.get(L_TOPOLOGY_DEPLOYMENT):
        return f"{cluster}-{labels[L_TOPOLOGY_DEPLOYMENT]}"
    return labels.get(L_DEPLOYMENT, "")


class CapiMachines(MachineProvider):
    """Read the machines of workload clusters from one management cluster."""

    name = "cluster-api"

    def __init__(self, management: client.ApiClient):
        super().__init__({})
        self.custom = client.CustomObjectsApi(management)
        self._access: dict[str, MachineProvider] = {}

    # --- the view
    def list_machines(self, cluster: str | None = None, namespace: str | None = None,
                      selector: Mapping[str, str] | None = None) -> list[Machine]:
        sel = dict(selector or {})
        if cluster:
            sel[L_CLUSTER_NAME] = cluster
        label_selector = ",".join(f"{k}={v}" for k, v in sel.items())
        if namespace:
            items = self.custom.list_namespaced_custom_object(CAPI_GROUP, CAPI_VERSION, namespace, "machines",
                                                              label_selector=label_selector)["items"]
        else:
            items = self.custom.list_cluster_custom_object(CAPI_GROUP, CAPI_VERSION, "machines",
                                                           label_selector=label_selector)["items"]
        return sorted((self._to_machine(o) for o in items), key=lambda m: m.name)

    def _to_machine(self, o: Mapping[str, Any]) -> Machine:
        meta, spec, status = o["metadata"], o.get("spec") or {}, o.get("status") or {}
        labels = meta.get("labels") or {}
        cluster = spec.get("clusterName") or labels.get(L_CLUSTER_NAME, "")
        node = (status.get("nodeRef") or {}).get("name")
        name = node or (spec.get("infrastructureRef") or {}).get("name") or meta["name"]
        addrs = tuple(a["address"] for a in status.get("addresses") or [] if a.get("type") == "InternalIP")
        state = "deleting" if meta.get("deletionTimestamp") else STATES.get(status.get("phase", ""), "provisioning")
        return Machine(name=name, cluster=cluster, namespace=meta["namespace"],
                       role="control-plane" if L_CONTROL_PLANE in labels else "worker",
                       deployment=deployment_of(cluster, labels), provider_id=spec.get("providerID", ""),
                       state=state, addresses=addrs, labels={**labels, "cluster.x-k8s.io/machine": meta["name"]})

    def get_machine(self, name: str) -> Machine | None:
        return next((m for m in self.list_machines() if m.name == name), None)

    def machine_object(self, machine: Machine) -> str:
        """The name of the Machine object behind ``machine``."""
        return machine.labels["cluster.x-k8s.io/machine"]

    # --- reaching a machine: through its infrastructure's provider
    def access(self, machine: Machine) -> MachineProvider:
        scheme = machine.provider_id.split("://", 1)[0] if "://" in machine.provider_id else ""
        if not scheme:
            raise ProviderError(f"{machine.name}: no spec.providerID yet (machine {machine.state})")
        if scheme not in self._access:
            provider = registry.machine_access(scheme)
            if provider is None:
                raise ProviderError(f"{machine.name}: no provider reaches machines with providerID scheme "
                                    f"{scheme!r} ({machine.provider_id}); registered schemes: "
                                    f"{registry.machine_access_schemes()} (entry point group "
                                    f"{registry.ACCESS_GROUP})")
            self._access[scheme] = provider
        return self._access[scheme]

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

    def delete_machine(self, machine: Machine) -> None:
        """Delete the Machine object: the controllers drain it and remove its infrastructure."""
        try:
            self.custom.delete_namespaced_custom_object(CAPI_GROUP, CAPI_VERSION, machine.namespace, "machines",
                                                        self.machine_object(machine))
        except client.ApiException as e:
            if e.status != 404:
                raise

    # --- what Cluster API does, not the harness
    def _controllers_do_it(self, what: str) -> ProviderError:
        return ProviderError(f"{what}: Cluster API's controllers do this in Cluster API mode (scale the "
                             f"KubeadmControlPlane or MachineDeployment, or delete the Cluster)")

    def create_machine(self, spec: MachineSpec) -> Machine:
        raise self._controllers_do_it(f"create machine for {spec.cluster}")

    def ensure_infrastructure(self, cluster: str, namespace: str, owner: Owner) -> None:
        raise self._controllers_do_it(f"infrastructure of {namespace}/{cluster}")

    def delete_infrastructure(self, cluster: str, namespace: str) -> None:
        raise self._controllers_do_it(f"infrastructure of {namespace}/{cluster}")

    def list_owned(self, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        return []

    def delete_owned(self, selector: Mapping[str, str]) -> list[str]:
        raise self._controllers_do_it("delete")

    def close(self) -> None:
        for p in self._access.values():
            p.close()
