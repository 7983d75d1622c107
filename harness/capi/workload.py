"""A workload cluster made by the Cluster API controllers from a cluster
template, the way a provider author's users make one.

``clusterctl generate cluster`` renders the template (or flavor) of the
infrastructure provider with its variables; the harness adjusts it for the
host (:func:`host_patches`), applies it to the management cluster, waits
for the control plane and the MachineDeployments (dumping ``clusterctl
describe`` on timeout), writes the kubeconfig from the
``<cluster>-kubeconfig`` Secret and installs its CNI as a DaemonSet. Nothing
here knows which infrastructure provider made the machines.
"""
from __future__ import annotations

import contextlib
import copy
import ipaddress
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import yaml
from kubernetes import client, config as kconfig, dynamic

from harness.cluster import Cluster, write_private
from harness.kubeadm import cni_daemonset, preflight
from harness.progress import phase

from .clusterctl import Clusterctl, ClusterctlError

log = logging.getLogger("harness.capi")

CAPI_GROUP, CAPI_VERSION = "cluster.x-k8s.io", "v1beta2"
KCP_GROUP = "controlplane.cluster.x-k8s.io"


class WorkloadError(Exception):
    pass


@dataclass
class Workload:
    name: str
    namespace: str
    kubeconfig_path: Path
    objects: list[dict]  # what was applied to the management cluster

    def api_client(self) -> client.ApiClient:
        return kconfig.new_client_from_config(str(self.kubeconfig_path))


def _kubeadm_specs(doc: dict) -> list[dict]:
    """The KubeadmConfigSpec(s) inside a CABPK/KCP object or template."""
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    if kind == "KubeadmControlPlane":
        return [spec.setdefault("kubeadmConfigSpec", {})]
    if kind == "KubeadmControlPlaneTemplate":
        return [spec.setdefault("template", {}).setdefault("spec", {}).setdefault("kubeadmConfigSpec", {})]
    if kind == "KubeadmConfigTemplate":
        return [spec.setdefault("template", {}).setdefault("spec", {})]
    if kind == "KubeadmConfig":
        return [spec]
    return []


def host_patches(docs: list[dict], cgroup_v1: bool) -> list[dict]:
    """What kubeadm nodes need on this host, as the direct mode gives it
    (:mod:`harness.kubeadm.preflight`): the preflight checks that fail in any
    node container are ignored; on a cgroup v1 host the kubelet runs with
    ``--fail-cgroupv1=false`` and SystemVerification is ignored too."""
    out = copy.deepcopy(docs)
    ignores = list(preflight.ignores(cgroup_v1))
    for doc in out:
        for spec in _kubeadm_specs(doc):
            for section in ("initConfiguration", "joinConfiguration"):
                reg = spec.setdefault(section, {}).setdefault("nodeRegistration", {})
                have = reg.setdefault("ignorePreflightErrors", [])
                have += [i for i in ignores if i not in have]
                if cgroup_v1:
                    args = reg.setdefault("kubeletExtraArgs", [])
                    if not any(a.get("name") == "fail-cgroupv1" for a in args):
                        args.append({"name": "fail-cgroupv1", "value": "false"})
    return out


def _cluster_network(docs: list[dict], name: str) -> tuple[str, str]:
    cl = next((d for d in docs if d.get("kind") == "Cluster" and d["metadata"]["name"] == name), None)
    if cl is None:
        raise WorkloadError(f"the generated template has no Cluster named {name!r}")
    net = (cl.get("spec") or {}).get("clusterNetwork") or {}
    pods = (net.get("pods") or {}).get("cidrBlocks") or []
    services = (net.get("services") or {}).get("cidrBlocks") or []
    if not pods:
        raise WorkloadError(f"Cluster {name}: spec.clusterNetwork.pods.cidrBlocks is empty; the harness's CNI "
                            f"needs the pod network")
    return ",".join(pods), ",".join(services)


def check_machine_networks(name: str, pods: str, services: str, machine_networks: Mapping[str, list[str]]) -> None:
    """The Cluster's pod and Service networks clear of the networks its machines are on.
    The CNI does not masquerade traffic to the pod network, so pods could not reach a
    machine (the control plane's load balancer among them) whose address is in it: the
    quick-start template's 192.168.0.0/16 meets a Docker network Docker put in 192.168.x."""
    for field, cidrs in (("pods", pods), ("services", services)):
        for cidr in filter(None, cidrs.split(",")):
            for network, subnets in machine_networks.items():
                clash = next((s for s in subnets if ipaddress.ip_network(cidr, strict=False).overlaps(
                    ipaddress.ip_network(s, strict=False))), None)
                if clash:
                    raise WorkloadError(
                        f"Cluster {name}: spec.clusterNetwork.{field}.cidrBlocks {cidr} overlaps {clash}, the "
                        f"subnet of Docker network {network!r} the machines are on; allowed: a network clear of "
                        f"{', '.join(subnets)} (the harness spec's spec.clusterNetwork.{field}), or remove "
                        f"Docker network {network!r} while nothing uses it so that Docker picks another subnet")


def _replicas(custom: client.CustomObjectsApi, name: str, namespace: str) -> tuple[str, bool]:
    """(progress line, whether every control plane and worker machine is up to date and ready)."""
    sel = f"cluster.x-k8s.io/cluster-name={name}"
    kcps = custom.list_namespaced_custom_object(KCP_GROUP, CAPI_VERSION, namespace, "kubeadmcontrolplanes",
                                                label_selector=sel)["items"]
    mds = custom.list_namespaced_custom_object(CAPI_GROUP, CAPI_VERSION, namespace, "machinedeployments",
                                               label_selector=sel)["items"]
    parts, done = [], bool(kcps)
    for o in kcps + mds:
        want, st = (o.get("spec") or {}).get("replicas", 0), o.get("status") or {}
        ready, upd = st.get("readyReplicas", 0), st.get("upToDateReplicas", 0)
        parts.append(f"{o['kind']} {o['metadata']['name']} {ready}/{want} ready")
        done = done and ready == want and upd == want
    return "; ".join(parts) or "no KubeadmControlPlane yet", done


def set_cluster_network(docs: list[dict], name: str, pods: str, services: str, domain: str) -> list[dict]:
    """The Cluster's ``spec.clusterNetwork`` set to the harness spec's (comma-separated
    CIDRs become the one-per-family lists Cluster API writes); templates differ in their defaults."""
    out = copy.deepcopy(docs)
    cl = next((d for d in out if d.get("kind") == "Cluster" and d["metadata"]["name"] == name), None)
    if cl is None:
        raise WorkloadError(f"the generated template has no Cluster named {name!r}")
    net = cl.setdefault("spec", {}).setdefault("clusterNetwork", {})
    net["pods"] = {"cidrBlocks": pods.split(",")}
    net["services"] = {"cidrBlocks": services.split(",")}
    net["serviceDomain"] = domain
    return out


def apply(api: client.ApiClient, docs: list[dict], manager: str = "kube-harness") -> None:
    """Server-side apply of every document, in order (a ClusterClass before the Cluster using it)."""
    dyn = dynamic.DynamicClient(api)
    for d in docs:
        meta = d["metadata"]
        res = dyn.resources.get(api_version=d["apiVersion"], kind=d["kind"])
        dyn.server_side_apply(res, body=d, name=meta["name"], namespace=meta.get("namespace") if res.namespaced
                              else None, field_manager=manager, force_conflicts=True)


def ensure_namespace(api: client.ApiClient, namespace: str) -> None:
    try:
        client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    except client.ApiException as e:
        if e.status != 409:
            raise


def create(ctl: Clusterctl, management: Cluster, name: str, namespace: str, kubernetes_version: str,
           control_planes: int = 1, workers: int = 1, flavor: str = "", state_dir: Path | None = None,
           network: tuple[str, str, str] | None = None, timeout: float = 900) -> Workload:
    """A workload cluster made by CAPD from ``management``'s provider templates, its nodes
    patched for node containers on this host (see :func:`host_patches`)."""
    from .capd import machine_networks
    cgroup_v1 = preflight.cgroup_v1(management, management.control_planes[0])
    return generate(ctl, management.api_client(), name, namespace, kubernetes_version, control_planes, workers,
                    flavor=flavor, cgroup_v1=cgroup_v1, network=network, machine_networks=machine_networks(),
                    state_dir=state_dir or management.state_dir.parent / f"{namespace}-{name}", timeout=timeout)


def generate(ctl: Clusterctl, api: client.ApiClient, name: str, namespace: str, kubernetes_version: str,
             control_planes: int, workers: int, *, state_dir: Path | None = None, flavor: str = "",
             template: str = "", infrastructure: str = "", cgroup_v1: bool | None = None,
             network: tuple[str, str, str] | None = None, machine_networks: Mapping[str, list[str]] | None = None,
             timeout: float = 900, delete_on_failure: bool = True,
             store_kubeconfig: Callable[[str], Path] | None = None) -> Workload:
    """Generate (``clusterctl generate cluster``), apply and wait (see module doc).
    ``cgroup_v1`` None: no node-container patches; ``network``: (pods, services, domain)
    for the Cluster's clusterNetwork; ``machine_networks``: the networks (name: subnets) the
    machines will be on, checked before anything is applied (:func:`check_machine_networks`).
    The workload's kubeconfig goes to ``store_kubeconfig``
    (its handle's ``set_kubeconfig``), else to ``state_dir``/kubeconfig."""
    if store_kubeconfig is None:
        if state_dir is None:
            raise TypeError("generate() needs state_dir or store_kubeconfig")
        store_kubeconfig = _kubeconfig_in(state_dir)
    with phase("capi-workload", cluster=name):
        raw = ctl.generate_cluster(name, namespace, kubernetes_version, control_planes, workers, flavor,
                                   infrastructure=infrastructure, template=template)
        docs = [d for d in yaml.safe_load_all(raw) if d]
        if cgroup_v1 is not None:
            docs = host_patches(docs, cgroup_v1)
        if network:
            docs = set_cluster_network(docs, name, *network)
        pods, services = _cluster_network(docs, name)
        check_machine_networks(name, pods, services, machine_networks or {})
        ensure_namespace(api, namespace)
        apply(api, docs)
        try:
            return _wait(ctl, api, name, namespace, docs, pods, services, store_kubeconfig, timeout)
        except BaseException:
            # the controllers take back what they made (machines, load balancer)
            if delete_on_failure:
                with contextlib.suppress(Exception):
                    delete_cluster(api, name, namespace, timeout=300)
            raise


def _kubeconfig_in(state_dir: Path) -> Callable[[str], Path]:
    def store(text: str) -> Path:
        state_dir.mkdir(parents=True, exist_ok=True)
        write_private(state_dir / "kubeconfig", text)
        return state_dir / "kubeconfig"
    return store


def _wait(ctl: Clusterctl, api: client.ApiClient, name: str, namespace: str, docs: list[dict], pods: str,
          services: str, store_kubeconfig: Callable[[str], Path], timeout: float) -> Workload:
    """Wait for the machines, installing the CNI once the workload API answers."""
    custom = client.CustomObjectsApi(api)
    kubeconfig: Path | None = None
    end = time.monotonic() + timeout
    cni_installed, last = False, ""
    with phase("capi-machines", cluster=name):
        while True:
            line, done = _replicas(custom, name, namespace)
            if line != last:
                log.info(line, extra={"cluster": name, "phase": "capi-machines"})
                last = line
            if not cni_installed:
                try:
                    kubeconfig = store_kubeconfig(ctl.kubeconfig_of(name, namespace))
                    api = kconfig.new_client_from_config(str(kubeconfig))
                    cni_daemonset.install(api, pods, services, _kube_proxy_image(api))
                    cni_installed = True
                    log.info(f"CNI DaemonSet installed (pods {pods})", extra={"cluster": name, "phase": "cni"})
                except Exception as e:  # no kubeconfig or API yet
                    log.debug(f"CNI not installed yet: {type(e).__name__}: {str(e)[:200]}")
            if done and cni_installed:
                break
            if time.monotonic() > end:
                raise WorkloadError(f"workload cluster {namespace}/{name} not ready after {timeout:.0f}s "
                                    f"({line}):\n{_describe(ctl, name, namespace)}")
            time.sleep(5)
    return Workload(name, namespace, kubeconfig, docs)


def _kube_proxy_image(api: client.ApiClient) -> str:
    ds = client.AppsV1Api(api).read_namespaced_daemon_set("kube-proxy", "kube-system")
    return ds.spec.template.spec.containers[0].image


def _describe(ctl: Clusterctl, name: str, namespace: str) -> str:
    try:
        return ctl.describe(name, namespace)
    except ClusterctlError as e:
        return f"(clusterctl describe failed: {e})"


def delete(management: Cluster, workload: Workload, timeout: float = 600) -> None:
    """Delete the workload's Cluster, wait until the controllers removed it (and its machines),
    then remove its kubeconfig (and the directory holding it, when empty)."""
    delete_cluster(management.api_client(), workload.name, workload.namespace, timeout)
    workload.kubeconfig_path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        workload.kubeconfig_path.parent.rmdir()


def delete_cluster(api: client.ApiClient, name: str, namespace: str, timeout: float = 600) -> None:
    """Delete the Cluster and wait until the controllers removed it (and with it its machines)."""
    custom = client.CustomObjectsApi(api)
    with phase("capi-delete", cluster=name):
        try:
            custom.delete_namespaced_custom_object(CAPI_GROUP, CAPI_VERSION, namespace, "clusters", name)
        except client.ApiException as e:
            if e.status != 404:
                raise
        end = time.monotonic() + timeout
        while True:
            try:
                custom.get_namespaced_custom_object(CAPI_GROUP, CAPI_VERSION, namespace, "clusters", name)
            except client.ApiException as e:
                if e.status == 404:
                    return
                raise
            if time.monotonic() > end:
                raise WorkloadError(f"Cluster {namespace}/{name} still there after {timeout:.0f}s")
            time.sleep(3)
