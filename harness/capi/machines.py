"""A workload cluster's machines as the harness's tests see them.

Cluster API owns these machines: they are listed from the management
cluster's ``Machine`` objects (role, MachineDeployment, Node name, phase)
and reached through the provider whose ``spec.providerID`` scheme they carry
(:class:`harness.reached.ReachedMachines`; CAPD's ``docker://`` machines are
containers the harness's Docker provider can exec into, stop and start).
Creating machines is the controllers' job: scale the KubeadmControlPlane or
MachineDeployment instead (:mod:`.controller`).
"""
from __future__ import annotations

from typing import Any, Mapping

from kubernetes import client

from harness.reached import ReachedMachines
from providers.base import Machine

CAPI_GROUP, CAPI_VERSION = "cluster.x-k8s.io", "v1beta2"
L_CLUSTER_NAME = "cluster.x-k8s.io/cluster-name"
L_CONTROL_PLANE = "cluster.x-k8s.io/control-plane"
L_DEPLOYMENT = "cluster.x-k8s.io/deployment-name"
L_TOPOLOGY_DEPLOYMENT = "topology.cluster.x-k8s.io/deployment-name"
L_MACHINE = "cluster.x-k8s.io/machine"  # added by the view: the Machine object's name
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


class CapiMachines(ReachedMachines):
    """Read the machines of workload clusters from one management cluster."""

    name = "cluster-api"
    owner_hint = ("Cluster API's controllers (scale the KubeadmControlPlane or MachineDeployment, or delete "
                  "the Cluster)")

    def __init__(self, management: client.ApiClient):
        super().__init__()
        self.custom = client.CustomObjectsApi(management)

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
                       state=state, addresses=addrs, labels={**labels, L_MACHINE: meta["name"]})

    def machine_object(self, machine: Machine) -> str:
        """The name of the Machine object behind ``machine``."""
        return machine.labels[L_MACHINE]

    def delete_machine(self, machine: Machine) -> None:
        """Delete the Machine object: the controllers drain it and remove its infrastructure."""
        try:
            self.custom.delete_namespaced_custom_object(CAPI_GROUP, CAPI_VERSION, machine.namespace, "machines",
                                                        self.machine_object(machine))
        except client.ApiException as e:
            if e.status != 404:
                raise
