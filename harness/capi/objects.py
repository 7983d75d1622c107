"""Render the namespaced Cluster API objects of a :class:`ClusterSpec`.

Shape (all in ``spec.namespace``; ``<c>`` is the cluster name)::

    Secret                        <md>-bootstrap      (type cluster.x-k8s.io/secret, key value)
    HarnessDockerCluster          <c>                 (provider options, kubeadm patches)
    HarnessDockerMachineTemplate  <md>                one per MachineDeployment
    Cluster                       <c>                 clusterNetwork from the spec,
                                                      infrastructureRef -> HarnessDockerCluster
    MachineDeployment             <c>-control-plane   replicas = controlPlane.replicas, machines
                                                      labelled cluster.x-k8s.io/control-plane
    MachineDeployment             <c>-<md>            one per worker machineDeployment

Every MachineDeployment has ``spec.clusterName``, ``replicas``, a
``selector`` on ``cluster.x-k8s.io/cluster-name`` +
``cluster.x-k8s.io/deployment-name``, and a ``template`` with ``version``,
``bootstrap.dataSecretName`` and ``infrastructureRef`` to its
HarnessDockerMachineTemplate.

The control plane
-----------------
Real Cluster API manages a control plane through a control-plane provider
(``KubeadmControlPlane``, ``Cluster.spec.controlPlaneRef``). Its controller
is a Go program we cannot run here, so the control plane is a
MachineDeployment whose Machines carry the ``cluster.x-k8s.io/control-plane``
label and no ``controlPlaneRef`` is set. CAPI core accepts that shape: with
no controlPlaneRef its Cluster controller marks ``ControlPlaneInitialized``
from the first labelled Machine with a nodeRef (``controlPlaneReady`` then
stays false, which :mod:`.management` accounts for). A MachineDeployment
rather than hand-named Machines lets the controller name each Machine after
the node it bootstraps (the kubeadm init of the first control plane and the
one-at-a-time joins stay in ``harness.controller.MachineController``).

Bootstrap data
--------------
There is no bootstrap provider (``KubeadmConfig``) either: each
MachineDeployment names a pre-made data Secret (``bootstrap.dataSecretName``,
which satisfies CAPI's contract: bootstrapReady follows from it). For the
harness's controller it only says "bootstrapped by the harness's kubeadm
bootstrapper in role X"; the harness never runs cloud-init.
"""
from __future__ import annotations

import base64
import copy
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import yaml

from harness.spec import ClusterSpec, MachineDeploymentSpec, parse

from . import (CAPI_API, CAPI_GROUP, CAPI_VERSION, INFRA_API, INFRA_CLUSTER_KIND, INFRA_GROUP,
               INFRA_MACHINE_KIND, INFRA_TEMPLATE_KIND, INFRA_VERSION, L_CLUSTER_NAME, L_CONTROL_PLANE,
               L_DEPLOYMENT_NAME, SECRET_TYPE)

#: ClusterClass-style label naming the topology entry a MachineDeployment comes from
L_TOPOLOGY_MD = "topology.cluster.x-k8s.io/deployment-name"
L_HARNESS_ROLE = "harness.k8s.io/role"


@dataclass(frozen=True)
class InfraKinds:
    """The infrastructure kinds the rendered objects reference: the
    harness's Docker ones by default, a provider author's own otherwise."""
    api_version: str = INFRA_API
    cluster: str = INFRA_CLUSTER_KIND
    machine: str = INFRA_MACHINE_KIND
    machine_template: str = INFRA_TEMPLATE_KIND

    @property
    def ours(self) -> bool:
        return self.api_version == INFRA_API and self.cluster == INFRA_CLUSTER_KIND


HARNESS_DOCKER = InfraKinds()

#: kind -> (group, version, plural) for the CustomObjectsApi
RESOURCES: dict[str, tuple[str, str, str]] = {
    "Cluster": (CAPI_GROUP, CAPI_VERSION, "clusters"),
    "Machine": (CAPI_GROUP, CAPI_VERSION, "machines"),
    "MachineDeployment": (CAPI_GROUP, CAPI_VERSION, "machinedeployments"),
    "MachineSet": (CAPI_GROUP, CAPI_VERSION, "machinesets"),
    "MachineHealthCheck": (CAPI_GROUP, CAPI_VERSION, "machinehealthchecks"),
    INFRA_CLUSTER_KIND: (INFRA_GROUP, INFRA_VERSION, "harnessdockerclusters"),
    INFRA_MACHINE_KIND: (INFRA_GROUP, INFRA_VERSION, "harnessdockermachines"),
    INFRA_TEMPLATE_KIND: (INFRA_GROUP, INFRA_VERSION, "harnessdockermachinetemplates"),
}


def resource(obj_or_kind: Mapping[str, Any] | str) -> tuple[str, str, str]:
    if isinstance(obj_or_kind, str):
        return RESOURCES[obj_or_kind]
    group, _, version = obj_or_kind["apiVersion"].rpartition("/")
    kind = obj_or_kind["kind"]
    if kind in RESOURCES and RESOURCES[kind][0] == group:
        return group, version, RESOURCES[kind][2]
    return group, version, kind.lower() + "s"


def _meta(name: str, ns: str, labels: Mapping[str, str] | None = None, **kw: Any) -> dict:
    m: dict[str, Any] = {"name": name, "namespace": ns}
    if labels:
        m["labels"] = dict(labels)
    m.update(kw)
    return m


def bootstrap_secret_name(md: str) -> str:
    return f"{md}-bootstrap"


def kubeconfig_secret_name(cluster: str) -> str:
    """CAPI convention: ``<cluster>-kubeconfig``, key ``value``."""
    return f"{cluster}-kubeconfig"


def topology_name(spec: ClusterSpec, md: MachineDeploymentSpec) -> str:
    return "control-plane" if md.role == "control-plane" else md.name[len(spec.name) + 1:]


def render(spec: ClusterSpec, infra: InfraKinds = HARNESS_DOCKER, *, bootstrap_secrets: bool = True) -> list[dict]:
    """The objects to apply, in apply order (referenced before referencing).

    With ``infra`` other than the harness's own kinds, no infrastructure
    objects are rendered: the provider author supplies their cluster object
    and machine templates (same names: ``<cluster>`` and ``<md>``)."""
    ns, name = spec.namespace, spec.name
    cl_labels = {L_CLUSTER_NAME: name}
    out: list[dict] = []
    for md in spec.deployments:
        if bootstrap_secrets:
            out.append(bootstrap_secret(spec, md))
    if infra.ours:
        out.append({"apiVersion": INFRA_API, "kind": INFRA_CLUSTER_KIND,
                    "metadata": _meta(name, ns, cl_labels),
                    "spec": {"options": copy.deepcopy(spec.provider_options),
                             "kubeadm": copy.deepcopy(spec.kubeadm_patches)}})
        for md in spec.deployments:
            tspec: dict[str, Any] = {}
            if md.labels:
                tspec["nodeLabels"] = dict(md.labels)
            out.append({"apiVersion": INFRA_API, "kind": INFRA_TEMPLATE_KIND,
                        "metadata": _meta(md.name, ns, cl_labels),
                        "spec": {"template": {"spec": tspec}}})
    out.append({
        "apiVersion": CAPI_API, "kind": "Cluster",
        "metadata": _meta(name, ns, cl_labels),
        "spec": {
            "clusterNetwork": {"pods": {"cidrBlocks": [spec.pod_cidr]},
                               "services": {"cidrBlocks": [spec.service_cidr]},
                               "serviceDomain": spec.service_domain},
            "infrastructureRef": {"apiVersion": infra.api_version, "kind": infra.cluster,
                                  "name": name, "namespace": ns},
        },
    })
    for md in spec.deployments:
        out.append(machine_deployment(spec, md, infra))
    return out


def md_labels(cluster: str, md: str, control_plane: bool) -> dict[str, str]:
    labels = {L_CLUSTER_NAME: cluster, L_DEPLOYMENT_NAME: md}
    if control_plane:
        labels[L_CONTROL_PLANE] = ""
    return labels


def machine_deployment(spec: ClusterSpec, md: MachineDeploymentSpec, infra: InfraKinds = HARNESS_DOCKER) -> dict:
    cp = md.role == "control-plane"
    sel = {L_CLUSTER_NAME: spec.name, L_DEPLOYMENT_NAME: md.name}
    meta_labels = {L_CLUSTER_NAME: spec.name, L_TOPOLOGY_MD: topology_name(spec, md), L_HARNESS_ROLE: md.role}
    if cp:
        meta_labels[L_CONTROL_PLANE] = ""
    return {
        "apiVersion": CAPI_API, "kind": "MachineDeployment",
        "metadata": _meta(md.name, spec.namespace, meta_labels),
        "spec": {
            "clusterName": spec.name,
            "replicas": md.replicas,
            "selector": {"matchLabels": sel},
            "template": {
                "metadata": {"labels": md_labels(spec.name, md.name, cp)},
                "spec": {
                    "clusterName": spec.name,
                    "version": spec.version,
                    "bootstrap": {"dataSecretName": bootstrap_secret_name(md.name)},
                    "infrastructureRef": {"apiVersion": infra.api_version, "kind": infra.machine_template,
                                          "name": md.name, "namespace": spec.namespace},
                },
            },
        },
    }


def bootstrap_secret(spec: ClusterSpec, md: MachineDeploymentSpec) -> dict:
    value = yaml.safe_dump({"bootstrapper": "harness-kubeadm", "role": md.role, "version": spec.version,
                            "note": "machines of this MachineDeployment are bootstrapped by the harness "
                                    "(kubeadm init/join through harness.kubeadm), not by cloud-init"})
    return {"apiVersion": "v1", "kind": "Secret", "type": SECRET_TYPE,
            "metadata": _meta(bootstrap_secret_name(md.name), spec.namespace, {L_CLUSTER_NAME: spec.name}),
            "data": {"value": _b64(value), "format": _b64("harness")}}


def kubeconfig_secret(cluster: str, namespace: str, kubeconfig: str, owner: Mapping[str, Any] | None = None) -> dict:
    meta = _meta(kubeconfig_secret_name(cluster), namespace, {L_CLUSTER_NAME: cluster})
    if owner:
        meta["ownerReferences"] = [owner_ref(owner, controller=True)]
    return {"apiVersion": "v1", "kind": "Secret", "type": SECRET_TYPE, "metadata": meta,
            "data": {"value": _b64(kubeconfig)}}


def owner_ref(obj: Mapping[str, Any], controller: bool = False) -> dict:
    ref = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
           "uid": obj["metadata"]["uid"]}
    if controller:
        ref["controller"] = True
        ref["blockOwnerDeletion"] = True
    return ref


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def machine_for(md: Mapping[str, Any], name: str, infra_template: Mapping[str, Any] | None) -> tuple[dict, dict | None]:
    """A Machine (and its HarnessDockerMachine) from a MachineDeployment's
    template, as a MachineSet would create it."""
    ns = md["metadata"]["namespace"]
    tmpl = md["spec"]["template"]
    labels = dict((tmpl.get("metadata") or {}).get("labels") or {})
    mspec = copy.deepcopy(tmpl["spec"])
    iref = mspec["infrastructureRef"]
    infra_obj = None
    if infra_template is not None:
        t = infra_template["spec"]["template"]
        infra_obj = {"apiVersion": iref["apiVersion"], "kind": INFRA_MACHINE_KIND,
                     "metadata": _meta(name, ns, {**((t.get("metadata") or {}).get("labels") or {}), **labels}),
                     "spec": copy.deepcopy(t.get("spec") or {})}
        mspec["infrastructureRef"] = {"apiVersion": iref["apiVersion"], "kind": INFRA_MACHINE_KIND,
                                      "name": name, "namespace": ns}
    machine = {"apiVersion": CAPI_API, "kind": "Machine",
               "metadata": _meta(name, ns, labels, ownerReferences=[owner_ref(md, controller=True)]),
               "spec": mspec}
    return machine, infra_obj


# --- back from objects to a ClusterSpec ---------------------------------

def spec_from_objects(cluster: Mapping[str, Any], infra_cluster: Mapping[str, Any] | None,
                      deployments: Iterable[Mapping[str, Any]],
                      templates: Mapping[str, Mapping[str, Any]] | None = None) -> ClusterSpec:
    """The harness spec the controller acts on, from the applied objects.

    Worker MachineDeployments scaled to 0 stay in the spec with one replica
    (a spec cannot say 0); the controller reads replicas from the objects."""
    name, ns = cluster["metadata"]["name"], cluster["metadata"]["namespace"]
    net = (cluster.get("spec") or {}).get("clusterNetwork") or {}
    ispec = (infra_cluster or {}).get("spec") or {}
    cp_mds = [m for m in deployments if L_CONTROL_PLANE in ((m["spec"]["template"].get("metadata") or {})
                                                             .get("labels") or {})]
    workers = [m for m in deployments if m not in cp_mds]
    if len(cp_mds) != 1:
        raise ValueError(f"Cluster {ns}/{name}: expected one control-plane MachineDeployment (template label "
                         f"{L_CONTROL_PLANE}), found {[m['metadata']['name'] for m in cp_mds]}")
    cp = cp_mds[0]
    version = cp["spec"]["template"]["spec"].get("version")
    templates = templates or {}

    def node_labels(md: Mapping[str, Any]) -> dict:
        t = templates.get(md["metadata"]["name"]) or {}
        return dict(((t.get("spec") or {}).get("template", {}).get("spec") or {}).get("nodeLabels") or {})

    doc: dict[str, Any] = {
        "apiVersion": "harness.k8s.io/v1alpha1", "kind": "Cluster",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "provider": {"name": "docker", "options": copy.deepcopy(ispec.get("options") or {})},
            "clusterNetwork": {k: v for k, v in {
                "pods": ((net.get("pods") or {}).get("cidrBlocks") or [None])[0],
                "services": ((net.get("services") or {}).get("cidrBlocks") or [None])[0],
                "serviceDomain": net.get("serviceDomain")}.items() if v},
            "topology": {
                "version": version,
                "controlPlane": {"replicas": max(1, int(cp["spec"].get("replicas", 1))),
                                 **({"labels": node_labels(cp)} if node_labels(cp) else {})},
                "workers": {"machineDeployments": [
                    {"name": _md_short(name, w), "replicas": max(1, int(w["spec"].get("replicas", 1))),
                     **({"labels": node_labels(w)} if node_labels(w) else {})} for w in workers]},
            },
        },
    }
    if ispec.get("kubeadm"):
        doc["spec"]["kubeadm"] = copy.deepcopy(ispec["kubeadm"])
    return parse(doc, f"{ns}/{name}", providers={"docker"})


def _md_short(cluster: str, md: Mapping[str, Any]) -> str:
    n = md["metadata"]["name"]
    short = (md["metadata"].get("labels") or {}).get(L_TOPOLOGY_MD)
    if short and f"{cluster}-{short}" == n:
        return short
    if n.startswith(cluster + "-"):
        return n[len(cluster) + 1:]
    raise ValueError(f"MachineDeployment {n}: the harness names MachineDeployments <cluster>-<name> "
                     f"({cluster}-...) so that machine names stay unique per cluster")
