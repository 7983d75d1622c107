"""Workload clusters made, scaled and deleted by Cluster API's controllers:
the ``cluster`` fixture's Cluster API mode.

:class:`CapiController` has the direct mode's interface
(:class:`harness.controller.MachineController`: provision, adopt, scale,
remediate, teardown), so the suites run unchanged on either. It maps the
harness's cluster spec onto ``clusterctl generate cluster`` (version,
control-plane and worker counts, clusterNetwork), and its scale and repair
onto the Cluster's topology (or, without a ClusterClass, the
KubeadmControlPlane's and MachineDeployment's replicas).
"""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable, Iterator

from kubernetes import client

from harness import interrupts
from harness.cluster import Cluster
from harness.controller import ProvisionError
from harness.progress import phase
from harness.spec import ClusterSpec, SpecError
from harness.waits import node_ready, until
from providers.base import Machine, Owner

from . import workload
from .clusterctl import MissingVariables
from .machines import CAPI_GROUP, CAPI_VERSION, L_CLUSTER_NAME, CapiMachines
from .management import Management

log = logging.getLogger("harness.capi")
KCP_GROUP = "controlplane.cluster.x-k8s.io"


@contextlib.contextmanager
def _named_variables(m: Management) -> Iterator[None]:
    """A template with unset variables is the user's input: name the option and the variables."""
    try:
        yield
    except MissingVariables as e:
        option, value = ("--capi-template", m.template) if m.template else ("--capi-flavor", m.flavor or "(default)")
        raise SpecError(option, value, f"a cluster template whose variables are all set; not set: {e.names} (give "
                                       f"them with --capi-var NAME=VALUE, the environment or the clusterctl config)"
                        ) from None


def check_spec(spec: ClusterSpec, supports: tuple[int, int] | None) -> None:
    """What the spec asks that a cluster template (or the providers, ``supports``: the
    lowest and highest Kubernetes minor) cannot give, before anything is made."""
    errors = []
    if spec.kubeadm_patches:
        errors.append(SpecError("spec.kubeadm", sorted(spec.kubeadm_patches),
                                "nothing in Cluster API mode: the template's KubeadmConfigSpec configures kubeadm",
                                spec.source))
    if len(spec.workers) > 1:
        errors.append(SpecError("spec.topology.workers.machineDeployments", [d.name for d in spec.workers],
                                "at most one MachineDeployment in Cluster API mode (clusterctl generate cluster "
                                "takes one worker count)", spec.source))
    if spec.ip_family != "ipv4":
        errors.append(SpecError("spec.clusterNetwork.ipFamily", spec.ip_family,
                                "ipv4 in Cluster API mode for now (the harness's CNI is installed on IPv4 workload "
                                "clusters; dual-stack and IPv6 clusters are made in direct mode)", spec.source))
    if supports and not supports[0] <= spec.minor <= supports[1]:
        errors.append(SpecError("spec.topology.version", spec.version,
                                f"a Kubernetes version from v1.{supports[0]} to v1.{supports[1]}: the Cluster API "
                                f"release the harness builds supports these for workload clusters", spec.source))
    if errors:
        raise SpecError.of(errors)


class CapiController:
    def __init__(self, management: Management, owner: Owner, ready_timeout: float = 900):
        self.management = management
        self.owner = owner
        self.api = management.api_client()
        self.custom = client.CustomObjectsApi(self.api)
        self.provider = CapiMachines(self.api)
        self.ready_timeout = ready_timeout

    # --- whole clusters
    def provision(self, spec: ClusterSpec, *, keep_on_failure: bool = False,
                  on_failure: Callable[[Cluster], None] | None = None) -> Cluster:
        check_spec(spec, self.management.supports)
        if self._cluster_object(spec.name, spec.namespace) is not None:
            raise ProvisionError(f"Cluster {spec.namespace}/{spec.name} already exists in the "
                                 f"{self.management}; use --reuse-cluster or delete it")
        cluster = Cluster(spec, self.provider, self.owner)
        t0 = time.monotonic()
        m = self.management
        try:
            with phase("image", cluster=spec.name, timings=cluster.timings):
                m.prepare(spec.version)
            with phase("cluster-api", cluster=spec.name, timings=cluster.timings), _named_variables(m):
                workload.generate(m.clusterctl, self.api, spec.name, spec.namespace, spec.version,
                                  spec.control_plane.replicas, sum(d.replicas for d in spec.workers),
                                  store_kubeconfig=cluster.set_kubeconfig, flavor=m.flavor, template=m.template,
                                  infrastructure=m.infrastructure, cgroup_v1=m.container_cgroup_v1,
                                  network=(spec.pod_cidr, spec.service_cidr, spec.service_domain),
                                  machine_networks=m.machine_networks(),
                                  timeout=self.ready_timeout, delete_on_failure=not (keep_on_failure or
                                                                                     self.owner.keep))
            with phase("ready", cluster=spec.name, timings=cluster.timings):
                self._system_pods(cluster)
        except BaseException:
            if on_failure is not None and cluster.kubeconfig_path.exists():
                try:
                    on_failure(cluster)
                except Exception as e:
                    log.warning(f"collecting failure artifacts failed: {e}")
            raise
        cluster.mark_bootstrapped()
        cluster.timings["provision"] = round(time.monotonic() - t0, 2)
        return cluster

    def exists(self, spec: ClusterSpec) -> bool:
        return self._cluster_object(spec.name, spec.namespace) is not None

    def adopt(self, spec: ClusterSpec) -> Cluster:
        cluster = Cluster(spec, self.provider, self.owner)
        if self._cluster_object(spec.name, spec.namespace) is None:
            raise ProvisionError(f"no Cluster {spec.namespace}/{spec.name} in the {self.management}")
        if not cluster.kubeconfig_path.exists():
            cluster.set_kubeconfig(self.management.clusterctl.kubeconfig_of(spec.name, spec.namespace))
        cluster.mark_bootstrapped()
        return cluster

    def teardown(self, cluster: Cluster | ClusterSpec) -> list[str]:
        """Delete the Cluster; the controllers remove its machines (and CAPD its containers)."""
        names = [m.name for m in self.provider.list_machines(cluster.name, cluster.namespace)]
        with interrupts.deferred(f"teardown of {cluster.namespace}/{cluster.name}"), \
                phase("teardown", cluster=cluster.name):
            workload.delete_cluster(self.api, cluster.name, cluster.namespace)
            Cluster.forget(cluster.name, cluster.namespace)
        return names

    def _system_pods(self, cluster: Cluster) -> None:
        from harness.kubeadm.bootstrap import KubeadmBootstrapper
        KubeadmBootstrapper(ready_timeout=300).wait_system_pods(cluster)

    def _cluster_object(self, name: str, namespace: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(CAPI_GROUP, CAPI_VERSION, namespace, "clusters", name)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    # --- machines
    def scale(self, cluster: Cluster, deployment: str, replicas: int) -> list[Machine]:
        """Set the replicas (topology, else the KubeadmControlPlane or MachineDeployment) and wait
        until the machines and their Nodes match; returns the machines that were added."""
        if deployment not in cluster.deployments:
            raise KeyError(f"cluster {cluster.name} has no MachineDeployment {deployment!r}; "
                           f"it has {sorted(cluster.deployments)}")
        cluster.check_replicas(deployment, replicas)
        md = cluster.deployments[deployment]
        before = {m.name for m in cluster.machines(deployment=deployment)}
        with phase("scale", cluster=cluster.name):
            self._set_replicas(cluster, md.role, deployment, replicas)
            cluster.set_replicas(deployment, replicas)
            now = self._wait_machines(cluster, deployment, replicas, f"{deployment} at {replicas} replicas")
        return [m for m in now if m.name not in before]

    def remediate(self, cluster: Cluster, machine: Machine) -> list[Machine]:
        """Replace ``machine``: delete its Machine; its owner (MachineSet or
        KubeadmControlPlane) makes a new one. Returns the new machines."""
        before = {m.name for m in cluster.machines(deployment=machine.deployment)}
        replicas = len(before)
        with phase("remediate", cluster=cluster.name, machine=machine.name):
            self.provider.delete_machine(machine)
            now = self._wait_machines(cluster, machine.deployment, replicas, f"{machine.name} replaced",
                                      gone=machine.name)
        return [m for m in now if m.name not in before]

    def delete_machine(self, cluster: Cluster, machine: Machine, drain: bool = True) -> None:
        self.provider.delete_machine(machine)

    def _set_replicas(self, cluster: Cluster, role: str, deployment: str, replicas: int) -> None:
        cl = self._cluster_object(cluster.name, cluster.namespace) or {}
        topology = (cl.get("spec") or {}).get("topology")
        if topology:
            if role == "control-plane":
                patch = {"controlPlane": {"replicas": replicas}}
            else:
                mds = topology["workers"]["machineDeployments"]
                short = deployment[len(cluster.name) + 1:]
                for md in mds:
                    if md["name"] == short:
                        md["replicas"] = replicas
                patch = {"workers": {"machineDeployments": mds}}
            self.custom.patch_namespaced_custom_object(CAPI_GROUP, CAPI_VERSION, cluster.namespace, "clusters",
                                                       cluster.name, {"spec": {"topology": patch}})
            return
        sel = f"{L_CLUSTER_NAME}={cluster.name}"
        if role == "control-plane":
            group, plural = KCP_GROUP, "kubeadmcontrolplanes"
            objs = self.custom.list_namespaced_custom_object(group, CAPI_VERSION, cluster.namespace, plural,
                                                             label_selector=sel)["items"]
        else:
            group, plural = CAPI_GROUP, "machinedeployments"
            objs = [o for o in self.custom.list_namespaced_custom_object(
                group, CAPI_VERSION, cluster.namespace, plural, label_selector=sel)["items"]
                if o["metadata"]["name"] in (deployment, deployment[len(cluster.name) + 1:])]
        if len(objs) != 1:
            raise ProvisionError(f"cluster {cluster.name}: expected one {plural} object for {deployment}, "
                                 f"found {[o['metadata']['name'] for o in objs]}")
        self.custom.patch_namespaced_custom_object(group, CAPI_VERSION, cluster.namespace, plural,
                                                   objs[0]["metadata"]["name"], {"spec": {"replicas": replicas}})

    def _wait_machines(self, cluster: Cluster, deployment: str, replicas: int, what: str,
                       gone: str | None = None) -> list[Machine]:
        """Wait for ``replicas`` running machines in ``deployment`` (``gone`` not among them),
        each a Ready Node, and no Node of a machine that left."""
        def settled() -> list[Machine] | None:
            ms = cluster.machines(deployment=deployment)
            if len(ms) != replicas or any(m.state != "running" for m in ms) or gone in {m.name for m in ms}:
                return None
            nodes = {n.metadata.name: n for n in cluster.core.list_node().items}
            names = {m.name for m in cluster.machines()}
            if not all(m.name in nodes and node_ready(nodes[m.name]) for m in ms) or set(nodes) - names:
                return None
            return ms
        return until(settled, self.ready_timeout, what, interval=3)
