"""The harness's Docker machine controller, as a Cluster API controller
process: ``python -m harness.capi.controller --kubeconfig K [--namespace NS]``.

It plays CAPI core *and* the infrastructure provider for Clusters whose
``infrastructureRef`` is a ``HarnessDockerCluster``, reusing the harness:
machines come from the Docker provider, the control plane is provisioned by
``harness.controller.MachineController`` with the ``KubeadmBootstrapper``
(kubeadm init, control-plane joins one at a time, CNI), and workers are
joined by the same bootstrapper.

Safe to run twice: every process competes for the Lease
``<namespace or default>/kube-harness-docker-controller``
(:mod:`.leader`); only the leader reconciles, the others wait. A leader that
cannot renew in time stops and exits (status 1) before its lease can expire;
on SIGTERM/SIGINT it finishes nothing new, releases the Lease and exits 0.

Reconcile loop (polling every ``--sync-period``), per Cluster:

1. skip when paused (``spec.paused`` or annotation ``cluster.x-k8s.io/paused``);
2. deletion (deletionTimestamp): every Machine's container deleted, then the
   cluster's network/load balancer/volumes, then finalizers removed;
3. add finalizers; derive a ClusterSpec from the Cluster, HarnessDockerCluster,
   MachineDeployments and templates (:func:`.objects.spec_from_objects`);
4. not initialized yet (no ``<cluster>-kubeconfig`` Secret): any half-made
   leftovers (a previous leader died mid-way) are torn down, then the control
   plane is provisioned all-or-nothing and the kubeconfig Secret written;
5. Machines, MachineSet-like: containers of the cluster without a Machine are
   adopted (a Machine named after the container); Machines being deleted get
   drained/removed (kubeadm reset, etcd member) and their finalizer dropped;
   Machines whose container vanished are deleted; each MachineDeployment is
   scaled to ``spec.replicas`` (new Machines ``<md>-<5 hex>``, excess ones
   deleted: not-running first, then newest); Machines without a container get
   one (named after the Machine), which is then joined;
6. status subresources: Machines (phase, nodeRef, providerID
   ``docker:////<container>``, addresses, bootstrapReady,
   infrastructureReady), HarnessDockerMachines, MachineDeployments
   (replicas/readyReplicas/updatedReplicas/availableReplicas), the
   HarnessDockerCluster and the Cluster (phase, infrastructureReady,
   controlPlaneReady, controlPlaneEndpoint).

Machines are owned directly by their MachineDeployment (no MachineSet
objects): a MachineDeployment here never rolls out a new template.

Containers belong to their Cluster objects, not to the process that made
them (another leader may manage them next): by default they are labelled
``keep`` so the harness reaper leaves them alone. A test session passes
``--owner-pid <its pid>`` so that the reaper removes them if the session
dies without deleting its Clusters.
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import datetime as dt
import logging
import os
import random
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping

from harness.cluster import Cluster
from harness.controller import MachineController, machine_name
from harness.progress import phase
from providers.base import Machine, MachineProvider, MachineSpec, Owner

from . import (A_PAUSED, F_CLUSTER, F_MACHINE, INFRA_API, INFRA_CLUSTER_KIND, INFRA_MACHINE_KIND, INFRA_TEMPLATE_KIND,
               L_CLUSTER_NAME, L_CONTROL_PLANE, L_DEPLOYMENT_NAME)
from .leader import LeaseElector
from .management import ManagementCluster, is_status
from .objects import (kubeconfig_secret, kubeconfig_secret_name, machine_for, md_labels, owner_ref,
                      spec_from_objects)

log = logging.getLogger("harness.capi")
LEASE_NAME = "kube-harness-docker-controller"
PROVIDER_ID_PREFIX = "docker:////"


class NotLeader(RuntimeError):
    """Leadership was lost: stop acting at once."""


class Shutdown(BaseException):
    """SIGTERM/SIGINT: stop."""


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def paused(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("spec") or {}).get("paused")) or A_PAUSED in (obj["metadata"].get("annotations") or {})


def is_ours(cluster: Mapping[str, Any]) -> bool:
    ref = (cluster.get("spec") or {}).get("infrastructureRef") or {}
    return ref.get("apiVersion") == INFRA_API and ref.get("kind") == INFRA_CLUSTER_KIND


def provider_id(container: str) -> str:
    return f"{PROVIDER_ID_PREFIX}{container}"


class DockerMachineReconciler:
    """Reconciles the Clusters of one namespace (or all) whose
    infrastructure is ours. ``is_leader`` is checked before every change."""

    def __init__(self, mgmt: ManagementCluster, owner: Owner, *, namespace: str | None = None,
                 bootstrapper: Any = None, provider_factory: Callable[[Mapping[str, Any]], MachineProvider] | None = None,
                 is_leader: Callable[[], bool] = lambda: True, internal_endpoint: bool = False):
        self.mgmt = mgmt
        self.internal_endpoint = internal_endpoint
        self.owner = owner
        self.namespace = namespace
        if bootstrapper is None:
            from harness.kubeadm.bootstrap import KubeadmBootstrapper
            bootstrapper = KubeadmBootstrapper()
        self.bootstrapper = bootstrapper
        self._provider_factory = provider_factory
        self._providers: dict[str, MachineProvider] = {}
        self._is_leader = is_leader
        self._backoff: dict[str, tuple[float, int]] = {}  # cluster -> (next try, failures)

    # --- plumbing -----------------------------------------------------------
    def check_leader(self) -> None:
        if not self._is_leader():
            raise NotLeader("not the leader any more")

    def provider(self, options: Mapping[str, Any]) -> MachineProvider:
        key = repr(sorted((options or {}).items()))
        if key not in self._providers:
            if self._provider_factory:
                self._providers[key] = self._provider_factory(options)
            else:
                from providers import registry
                self._providers[key] = registry.get("docker", options)
        return self._providers[key]

    def controller(self, provider: MachineProvider) -> MachineController:
        return MachineController(provider, self.owner, self.bootstrapper)

    def _patch(self, obj: Mapping[str, Any], body: Mapping[str, Any], status: bool = False) -> dict:
        self.check_leader()
        return self.mgmt.patch(obj, body, status=status)

    def _set_finalizers(self, obj: Mapping[str, Any], finalizers: list[str]) -> dict:
        # resourceVersion makes this an optimistic-concurrency update (409 on a stale read)
        return self._patch(obj, {"metadata": {"finalizers": finalizers,
                                              "resourceVersion": obj["metadata"]["resourceVersion"]}})

    def _add_finalizer(self, obj: dict, f: str) -> dict:
        fins = list(obj["metadata"].get("finalizers") or [])
        if f in fins:
            return obj
        return self._set_finalizers(obj, fins + [f])

    def _drop_finalizer(self, obj: dict, f: str) -> None:
        fins = list(obj["metadata"].get("finalizers") or [])
        if f in fins:
            try:
                self._set_finalizers(obj, [x for x in fins if x != f])
            except Exception as e:
                if not is_status(e, 404):
                    raise

    def _status(self, obj: Mapping[str, Any], status: Mapping[str, Any]) -> dict:
        """Patch the status subresource when it differs."""
        have = obj.get("status") or {}
        if all(have.get(k) == v for k, v in status.items()):
            return dict(obj)
        return self._patch(obj, {"status": dict(status)}, status=True)

    # --- loop ---------------------------------------------------------------
    def run(self, stop: threading.Event, sync_period: float = 5) -> None:
        while not stop.is_set():
            self.check_leader()
            self.reconcile_all()
            stop.wait(sync_period)

    def reconcile_all(self) -> None:
        for cl in self.mgmt.list("Cluster", self.namespace):
            if not is_ours(cl):
                continue
            key = f"{cl['metadata']['namespace']}/{cl['metadata']['name']}"
            nxt, fails = self._backoff.get(key, (0.0, 0))
            if time.monotonic() < nxt and not cl["metadata"].get("deletionTimestamp"):
                continue
            try:
                self.check_leader()
                self.reconcile(cl)
                self._backoff.pop(key, None)
            except (NotLeader, Shutdown, KeyboardInterrupt):
                raise
            except Exception as e:
                fails += 1
                delay = min(120.0, 5.0 * 2 ** (fails - 1))
                self._backoff[key] = (time.monotonic() + delay, fails)
                log.exception(f"reconcile of Cluster {key} failed ({fails}x; retry in {delay:.0f}s): {e}",
                              extra={"cluster": cl["metadata"]["name"], "phase": "reconcile"})
                self._record_failure(cl, e)

    def _record_failure(self, cl: Mapping[str, Any], e: Exception) -> None:
        try:
            fresh = self.mgmt.get("Cluster", cl["metadata"]["name"], cl["metadata"]["namespace"])
            if fresh and self._is_leader():
                conds = _set_condition((fresh.get("status") or {}).get("conditions"), "Ready", "False",
                                       "ReconcileError", f"{type(e).__name__}: {str(e)[:500]}")
                self._status(fresh, {"conditions": conds})
        except Exception:
            pass

    # --- one cluster --------------------------------------------------------
    def reconcile(self, cl: dict) -> None:
        name, ns = cl["metadata"]["name"], cl["metadata"]["namespace"]
        if paused(cl):
            log.debug("paused", extra={"cluster": name, "phase": "reconcile"})
            return
        infra = self.mgmt.get(INFRA_CLUSTER_KIND, cl["spec"]["infrastructureRef"]["name"], ns, INFRA_API)
        mds = [m for m in self.mgmt.list("MachineDeployment", ns) if m["spec"].get("clusterName") == name]
        if cl["metadata"].get("deletionTimestamp"):
            self.delete_cluster(cl, infra, mds)
            return
        if infra is None:
            log.info(f"waiting for {INFRA_CLUSTER_KIND} {ns}/{cl['spec']['infrastructureRef']['name']}",
                     extra={"cluster": name, "phase": "reconcile"})
            return
        cl = self._add_finalizer(cl, F_CLUSTER)
        if not any(r.get("uid") == cl["metadata"]["uid"] for r in infra["metadata"].get("ownerReferences") or []):
            infra = self._patch(infra, {"metadata": {"ownerReferences": [
                *(infra["metadata"].get("ownerReferences") or []), owner_ref(cl)]}})
        templates = {t["metadata"]["name"]: t for t in self.mgmt.list(INFRA_TEMPLATE_KIND, ns, api_version=INFRA_API)}
        spec = spec_from_objects(cl, infra, mds, templates)
        cp_md = spec.control_plane.name
        if cp_md not in {m["metadata"]["name"] for m in mds}:
            raise ValueError(f"the control-plane MachineDeployment of {ns}/{name} must be named {cp_md}")
        provider = self.provider(spec.provider_options)
        handle = Cluster(spec, provider, self.owner)  # state dir as MachineController.provision uses
        for md in mds:
            if md["metadata"]["name"] in handle.deployments:
                handle.deployments[md["metadata"]["name"]].replicas = int(md["spec"].get("replicas", 1))
        secret = self.mgmt.secret(kubeconfig_secret_name(name), ns)
        if secret is None:
            cl, infra = self.initialize(cl, infra, spec, provider)
        else:
            _restore_kubeconfig(handle, secret, self.internal_endpoint)
        self.reconcile_machines(cl, handle, mds, templates)
        self.update_status(cl, infra, handle, mds)

    def initialize(self, cl: dict, infra: dict, spec, provider: MachineProvider) -> tuple[dict, dict]:
        """Provision the control plane (all-or-nothing) and publish the kubeconfig."""
        name, ns = spec.name, spec.namespace
        ctl = self.controller(provider)
        leftovers = provider.list_owned({"harness.k8s.io/cluster": name, "harness.k8s.io/namespace": ns})
        if leftovers:
            log.warning(f"tearing down a half-made cluster ({len(leftovers)} objects; a previous attempt did not "
                        f"finish)", extra={"cluster": name, "phase": "reconcile"})
            self.check_leader()
            ctl.teardown(spec)
        state = Path(Cluster(spec, provider, self.owner).state_dir)
        for f in ("kubeadm.json", "kubeconfig"):
            (state / f).unlink(missing_ok=True)
        cl = self._status(cl, {"phase": "Provisioning", "infrastructureReady": False, "controlPlaneReady": False,
                               "observedGeneration": cl["metadata"].get("generation", 1)})
        cp_only = dataclasses.replace(spec, workers=())
        self.check_leader()
        with phase("capi-control-plane", cluster=name, logger=log):
            try:
                handle = ctl.provision(cp_only, keep_on_failure=True)
            except BaseException:
                # a leader tears its own half-made cluster down; a process that lost the
                # lease leaves it to the next leader (which does step 4 above)
                if self._is_leader():
                    try:
                        ctl.teardown(spec)
                    except Exception as e:
                        log.warning(f"teardown after failed provision: {e}", extra={"cluster": name})
                raise
        self.check_leader()
        kc = handle.kubeconfig
        cl = self.mgmt.get("Cluster", name, ns) or cl
        self.mgmt.apply([kubeconfig_secret(name, ns, kc, owner=cl)])
        host, port = self._endpoint(handle)
        infra = self._patch(infra, {"spec": {"controlPlaneEndpoint": {"host": host, "port": port}}})
        infra = self._status(infra, {"ready": True, "network": f"kh-{ns}-{name}"})
        cl = self._patch(cl, {"spec": {"controlPlaneEndpoint": {"host": host, "port": port}}})
        log.info(f"control plane initialized; API at https://{host}:{port}; Secret {kubeconfig_secret_name(name)} "
                 f"written", extra={"cluster": name, "phase": "capi-control-plane"})
        return cl, infra

    def _endpoint(self, handle: Cluster) -> tuple[str, int]:
        lb = handle.load_balancer()
        return handle.provider.host_endpoint(lb or handle.control_planes[0], 6443)

    # --- machines -----------------------------------------------------------
    def reconcile_machines(self, cl: dict, handle: Cluster, mds: list[dict], templates: Mapping[str, dict],
                           depth: int = 0) -> None:
        name, ns = cl["metadata"]["name"], cl["metadata"]["namespace"]
        ctl = self.controller(handle.provider)
        md_by_name = {m["metadata"]["name"]: m for m in mds}

        def machines() -> list[dict]:
            return self.mgmt.list("Machine", ns, {L_CLUSTER_NAME: name})

        def containers() -> dict[str, Machine]:
            return {m.name: m for m in handle.machines()}

        # Machines being deleted: drain/remove, delete the container, drop the finalizer
        for m in machines():
            if m["metadata"].get("deletionTimestamp") and F_MACHINE in (m["metadata"].get("finalizers") or []):
                c = containers().get(m["metadata"]["name"])
                if c is not None:
                    self.check_leader()
                    ctl.delete_machine(handle, c, drain=True)
                self._delete_infra_machine(m)
                self._drop_finalizer(m, F_MACHINE)
                log.info("machine deleted", extra={"cluster": name, "machine": m["metadata"]["name"],
                                                   "phase": "machine-delete"})
        # adopt containers with no Machine (control planes just provisioned; a crash mid-way)
        have = {m["metadata"]["name"]: m for m in machines()}
        for cname, c in containers().items():
            if cname in have:
                continue
            md = md_by_name.get(c.deployment)
            if md is None:
                log.warning(f"container {cname} belongs to no MachineDeployment ({c.deployment}); removing it",
                            extra={"cluster": name, "machine": cname})
                self.check_leader()
                ctl.delete_machine(handle, c, drain=True)
                continue
            self._create_machine(md, cname, templates)
            log.info(f"adopted container {cname} as Machine {ns}/{cname}",
                     extra={"cluster": name, "machine": cname, "phase": "adopt"})
        # a container that stopped before its Machine ever ran (failed boot): remove it, it is made again
        cs = containers()
        for m in machines():
            c = cs.get(m["metadata"]["name"])
            if c is not None and c.state != "running" and (m.get("status") or {}).get("phase") != "Running" \
                    and not m["metadata"].get("deletionTimestamp"):
                log.warning(f"container {c.name} is {c.state} before it ever ran; re-creating it",
                            extra={"cluster": name, "machine": c.name})
                self.check_leader()
                handle.provider.delete_machine(c)
        # Machines bound to a container that is gone: delete them (the MachineDeployment replaces them)
        cs = containers()
        for m in machines():
            pid = (m.get("spec") or {}).get("providerID")
            if pid and not m["metadata"].get("deletionTimestamp") and m["metadata"]["name"] not in cs:
                log.warning("machine's container is gone; deleting the Machine",
                            extra={"cluster": name, "machine": m["metadata"]["name"]})
                self._delete_machine_object(m)
        # scale each MachineDeployment
        for md in mds:
            want = int(md["spec"].get("replicas", 1))
            live = [m for m in machines() if m["metadata"].get("labels", {}).get(L_DEPLOYMENT_NAME)
                    == md["metadata"]["name"] and not m["metadata"].get("deletionTimestamp")]
            if len(live) < want:
                for _ in range(want - len(live)):
                    mname = machine_name(md["metadata"]["name"])
                    self._create_machine(md, mname, templates)
                    log.info(f"MachineDeployment {md['metadata']['name']}: created Machine {mname} "
                             f"({len(live) + 1}/{want})", extra={"cluster": name, "machine": mname,
                                                                 "phase": "scale-up"})
                    live.append({"metadata": {"name": mname}})
            elif len(live) > want:
                # as a MachineSet's deletePolicy: machines not Running go first, then the newest
                victims = sorted(live, key=lambda m: m["metadata"].get("creationTimestamp") or "", reverse=True)
                victims.sort(key=lambda m: (m.get("status") or {}).get("phase") == "Running")
                for m in victims[:len(live) - want]:
                    log.info(f"MachineDeployment {md['metadata']['name']}: deleting Machine {m['metadata']['name']} "
                             f"(scale to {want})", extra={"cluster": name, "machine": m["metadata"]["name"],
                                                         "phase": "scale-down"})
                    self._delete_machine_object(m)
        # deletions requested just now are carried out right away
        if depth == 0 and any(m["metadata"].get("deletionTimestamp") and F_MACHINE in
                              (m["metadata"].get("finalizers") or []) for m in machines()):
            return self.reconcile_machines(cl, handle, mds, templates, depth=1)
        # Machines without a container: create, boot, join
        cs = containers()
        pending = [m for m in machines() if m["metadata"]["name"] not in cs
                   and not m["metadata"].get("deletionTimestamp")]
        if pending:
            self.create_containers(handle, pending, md_by_name, templates)

    def _create_machine(self, md: dict, mname: str, templates: Mapping[str, dict]) -> dict:
        self.check_leader()
        tmpl = templates.get(md["spec"]["template"]["spec"]["infrastructureRef"]["name"])
        machine, infra_machine = machine_for(md, mname, tmpl)
        machine["metadata"]["finalizers"] = [F_MACHINE]
        created = self.mgmt.custom.create_namespaced_custom_object(
            "cluster.x-k8s.io", "v1beta1", machine["metadata"]["namespace"], "machines", machine)
        created.setdefault("apiVersion", machine["apiVersion"])
        created.setdefault("kind", "Machine")
        if infra_machine is not None:
            infra_machine["metadata"]["ownerReferences"] = [owner_ref(created, controller=True)]
            try:
                self.mgmt.custom.create_namespaced_custom_object(
                    "infrastructure.harness.k8s.io", "v1alpha1", machine["metadata"]["namespace"],
                    "harnessdockermachines", infra_machine)
            except Exception as e:
                if not is_status(e, 409):
                    raise
        self._status(created, {"phase": "Pending", "bootstrapReady": True, "infrastructureReady": False,
                               "lastUpdated": _now()})
        return created

    def _delete_machine_object(self, m: Mapping[str, Any]) -> None:
        self.check_leader()
        self.mgmt.delete(m)

    def _delete_infra_machine(self, m: Mapping[str, Any]) -> None:
        ref = (m.get("spec") or {}).get("infrastructureRef") or {}
        if ref.get("kind") == INFRA_MACHINE_KIND:
            self.mgmt.delete({"apiVersion": ref["apiVersion"], "kind": INFRA_MACHINE_KIND,
                              "metadata": {"name": ref["name"], "namespace": m["metadata"]["namespace"]}})

    def create_containers(self, handle: Cluster, pending: list[dict], md_by_name: Mapping[str, dict],
                          templates: Mapping[str, dict]) -> None:
        """One node container per pending Machine (named after it), then join."""
        name = handle.name
        image = self.bootstrapper.image(handle)
        specs = []
        for m in pending:
            labels = m["metadata"].get("labels") or {}
            md = md_by_name.get(labels.get(L_DEPLOYMENT_NAME, ""))
            if md is None:
                continue
            tmpl = templates.get(md["spec"]["template"]["spec"]["infrastructureRef"]["name"]) or {}
            tspec = ((tmpl.get("spec") or {}).get("template") or {}).get("spec") or {}
            options = {**handle.spec.provider_options, **(tspec.get("options") or {})}
            specs.append(MachineSpec(name=m["metadata"]["name"], cluster=name, namespace=handle.namespace,
                                     role="control-plane" if L_CONTROL_PLANE in labels else "worker",
                                     deployment=md["metadata"]["name"], image=tspec.get("image") or image,
                                     owner=self.owner, labels=dict(tspec.get("nodeLabels") or {}), options=options))
            self._status(m, {"phase": "Provisioning", "bootstrapReady": True, "lastUpdated": _now()})
        if not specs:
            return
        self.check_leader()
        with phase("capi-machines", cluster=name, machine=",".join(s.name for s in specs), logger=log):
            try:
                for s in specs:
                    with phase("machine-start", cluster=name, machine=s.name, logger=log):
                        mm = handle.provider.create_machine(s)
                        handle.provider.wait_booted(mm)
                booted = [handle.provider.get_machine(s.name) for s in specs]
                self.check_leader()
                with phase("join", cluster=name, logger=log):
                    self.bootstrapper.join(handle, [b for b in booted if b])
                with phase("ready", cluster=name, logger=log):
                    self.bootstrapper.ready(handle)
            except BaseException:
                # a machine that did not join is removed; its Machine stays and is retried
                if self._is_leader():
                    for s in specs:
                        try:
                            c = handle.provider.get_machine(s.name)
                            if c is not None:
                                handle.provider.delete_machine(c)
                        except Exception as e:
                            log.warning(f"cleanup of {s.name}: {e}", extra={"cluster": name})
                raise

    # --- status -------------------------------------------------------------
    def update_status(self, cl: dict, infra: dict, handle: Cluster, mds: list[dict]) -> None:
        name, ns = cl["metadata"]["name"], cl["metadata"]["namespace"]
        containers = {m.name: m for m in handle.machines()}
        nodes: dict[str, Any] = {}
        try:
            for n in handle.core.list_node().items:
                nodes[n.metadata.name] = n
        except Exception as e:
            log.warning(f"workload API unreachable: {type(e).__name__}: {str(e)[:200]}", extra={"cluster": name})
        machines = self.mgmt.list("Machine", ns, {L_CLUSTER_NAME: name})
        ready_by_md: dict[str, int] = {}
        count_by_md: dict[str, int] = {}
        cp_ready = False
        for m in machines:
            if m["metadata"].get("deletionTimestamp"):
                continue
            mname = m["metadata"]["name"]
            mdname = (m["metadata"].get("labels") or {}).get(L_DEPLOYMENT_NAME, "")
            count_by_md[mdname] = count_by_md.get(mdname, 0) + 1
            c = containers.get(mname)
            node = nodes.get(mname)
            node_ready = bool(node and any(x.type == "Ready" and x.status == "True"
                                           for x in (node.status.conditions or [])))
            if node_ready:
                ready_by_md[mdname] = ready_by_md.get(mdname, 0) + 1
                if L_CONTROL_PLANE in (m["metadata"].get("labels") or {}):
                    cp_ready = True
            if c is None:
                continue
            if (m.get("spec") or {}).get("providerID") != provider_id(mname):
                m = self._patch(m, {"spec": {"providerID": provider_id(mname)}})
            addresses = [{"type": "InternalIP", "address": a} for a in c.addresses] + \
                        [{"type": "Hostname", "address": mname}]
            infra_ready = c.state == "running"
            st: dict[str, Any] = {"bootstrapReady": True, "infrastructureReady": infra_ready, "addresses": addresses,
                                  "observedGeneration": m["metadata"].get("generation", 1)}
            if node is not None:
                st["nodeRef"] = {"apiVersion": "v1", "kind": "Node", "name": node.metadata.name,
                                 "uid": node.metadata.uid}
                st["phase"] = "Running"
                st["conditions"] = _set_condition(
                    _set_condition((m.get("status") or {}).get("conditions"), "NodeHealthy",
                                   "True" if node_ready else "False", "" if node_ready else "NodeNotReady", ""),
                    "Ready", "True" if node_ready and infra_ready else "False", "", "")
            else:
                st["phase"] = "Provisioned" if infra_ready else "Provisioning"
            if any((m.get("status") or {}).get(k) != v for k, v in st.items()):
                st["lastUpdated"] = _now()
            self._status(m, st)
            self._infra_machine_status(m, c, addresses, infra_ready)
        for md in mds:
            mdname = md["metadata"]["name"]
            want = int(md["spec"].get("replicas", 1))
            have, ready = count_by_md.get(mdname, 0), ready_by_md.get(mdname, 0)
            sel = md_labels(name, mdname, False)
            self._status(md, {
                "replicas": have, "readyReplicas": ready, "availableReplicas": ready, "updatedReplicas": have,
                "unavailableReplicas": max(0, want - ready),
                "selector": ",".join(f"{k}={v}" for k, v in sel.items()),
                "phase": "ScalingUp" if have < want else "ScalingDown" if have > want else
                         ("Running" if ready == want else "ScalingUp"),
                "observedGeneration": md["metadata"].get("generation", 1)})
        conds = (cl.get("status") or {}).get("conditions")
        conds = _set_condition(conds, "InfrastructureReady", "True", "", "")
        conds = _set_condition(conds, "ControlPlaneInitialized", "True", "", "")
        conds = _set_condition(conds, "ControlPlaneReady", "True" if cp_ready else "False",
                               "" if cp_ready else "WaitingForControlPlane", "")
        conds = _set_condition(conds, "Ready", "True" if cp_ready else "False",
                               "" if cp_ready else "WaitingForControlPlane", "")
        self._status(cl, {"phase": "Provisioned", "infrastructureReady": True, "controlPlaneReady": cp_ready,
                          "observedGeneration": cl["metadata"].get("generation", 1), "conditions": conds})

    def _infra_machine_status(self, m: Mapping[str, Any], c: Machine, addresses: list, ready: bool) -> None:
        ref = (m.get("spec") or {}).get("infrastructureRef") or {}
        if ref.get("kind") != INFRA_MACHINE_KIND:
            return
        im = self.mgmt.get(INFRA_MACHINE_KIND, ref["name"], m["metadata"]["namespace"], INFRA_API)
        if im is None:
            return
        if (im.get("spec") or {}).get("providerID") != provider_id(c.name):
            im = self._patch(im, {"spec": {"providerID": provider_id(c.name)}})
        self._status(im, {"ready": ready, "addresses": addresses})

    # --- deletion -----------------------------------------------------------
    def delete_cluster(self, cl: dict, infra: dict | None, mds: list[dict]) -> None:
        name, ns = cl["metadata"]["name"], cl["metadata"]["namespace"]
        if F_CLUSTER not in (cl["metadata"].get("finalizers") or []):
            return
        with phase("capi-delete", cluster=name, logger=log):
            cl = self._status(cl, {"phase": "Deleting"})
            spec = None
            try:
                templates = {t["metadata"]["name"]: t for t in
                             self.mgmt.list(INFRA_TEMPLATE_KIND, ns, api_version=INFRA_API)}
                spec = spec_from_objects(cl, infra, mds, templates)
            except Exception as e:
                log.warning(f"cannot rebuild the spec ({e}); deleting by labels", extra={"cluster": name})
            options = (spec.provider_options if spec else ((infra or {}).get("spec") or {}).get("options")) or {}
            provider = self.provider(options)
            for m in self.mgmt.list("Machine", ns, {L_CLUSTER_NAME: name}):
                if not m["metadata"].get("deletionTimestamp"):
                    self._delete_machine_object(m)
            for md in mds:
                self.check_leader()
                self.mgmt.delete(md)
            self.check_leader()
            # the whole cluster goes: no drains, just the machines and the infrastructure
            deleted = provider.delete_owned({"harness.k8s.io/cluster": name, "harness.k8s.io/namespace": ns})
            log.info(f"deleted {len(deleted)} provider objects", extra={"cluster": name, "phase": "capi-delete"})
            for m in self.mgmt.list("Machine", ns, {L_CLUSTER_NAME: name}):
                self._delete_infra_machine(m)
                self._drop_finalizer(m, F_MACHINE)
            if infra is not None:
                self._drop_finalizer(infra, F_CLUSTER)
                self.mgmt.delete(infra)
            state = Path(Cluster(spec, provider, self.owner).state_dir) if spec else None
            if state and state.is_dir():
                shutil.rmtree(state, ignore_errors=True)
            cl = self.mgmt.get("Cluster", name, ns)
            if cl is not None:
                self._drop_finalizer(cl, F_CLUSTER)


def _restore_kubeconfig(handle: Cluster, secret: Mapping[str, Any], internal: bool = False) -> None:
    """The workload kubeconfig from its Secret into the handle's state dir;
    ``internal``: with the server on the machines' network (a controller in a
    pod cannot reach the host's published port)."""
    kc = base64.b64decode(secret["data"]["value"]).decode()
    if internal:
        import yaml
        target = handle.load_balancer() or (handle.control_planes or [None])[0]
        if target is not None and target.ip:
            doc = yaml.safe_load(kc)
            for c in doc.get("clusters") or []:
                c["cluster"]["server"] = f"https://{target.ip}:6443"
            kc = yaml.safe_dump(doc, sort_keys=False)
    p = handle.kubeconfig_path
    if not p.exists() or p.read_text() != kc:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(kc)
        handle._client = None  # type: ignore[attr-defined]


def _set_condition(conds: list | None, ctype: str, status: str, reason: str, message: str) -> list[dict]:
    out = [dict(c) for c in conds or [] if c.get("type") != ctype]
    old = next((c for c in conds or [] if c.get("type") == ctype), None)
    c: dict[str, Any] = {"type": ctype, "status": status,
                         "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == status
                         else _now()}
    if reason:
        c["reason"] = reason
        c["severity"] = "Info" if status == "False" else ""
        if not c["severity"]:
            del c["severity"]
    if message:
        c["message"] = message
    out.append(c)
    return sorted(out, key=lambda x: (x["type"] != "Ready", x["type"]))


# --- the process ----------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.capi.controller",
                                description="The harness's Docker machine controller for Cluster API objects.")
    p.add_argument("--kubeconfig", default=None, help="management cluster kubeconfig")
    p.add_argument("--in-cluster", action="store_true", help="use the pod's service account (controller Deployment)")
    p.add_argument("--workload-endpoint", choices=("host", "internal"), default="host",
                   help="reach workload API servers at the host's published port (host) or on the machines' "
                        "network (internal: from a pod on a node)")
    p.add_argument("--namespace", default=None, help="reconcile Clusters of this namespace only (default: all)")
    p.add_argument("--lease-namespace", default=None, help="namespace of the Lease (default: --namespace or default)")
    p.add_argument("--lease-name", default=LEASE_NAME)
    p.add_argument("--identity", default=None, help="leader election identity (default: host_pid_random)")
    p.add_argument("--lease-duration", type=float, default=15)
    p.add_argument("--renew-deadline", type=float, default=10)
    p.add_argument("--retry-period", type=float, default=2)
    p.add_argument("--sync-period", type=float, default=5, help="seconds between reconcile passes")
    p.add_argument("--node-image", default=None, help="node image (default: built for each Cluster's version)")
    p.add_argument("--owner-pid", type=int, default=None,
                   help="process whose death lets the harness reaper remove the machines (e.g. the test session); "
                        "without it machines are labelled keep (deleted with their Cluster only)")
    p.add_argument("--run-id", default=os.environ.get("KUBE_HARNESS_RUN_ID") or f"capi-{uuid.uuid4().hex[:8]}")
    p.add_argument("--keep", action="store_true", help="label machines never to be reaped, also with --owner-pid")
    p.add_argument("--log-file", default=None, help="JSON log file (default: $ARTIFACTS/capi-controller-<id>.jsonl)")
    p.add_argument("--quiet", action="store_true", help="terminal shows warnings only")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.kubeconfig and not args.in_cluster:
        parser.error("one of --kubeconfig or --in-cluster is required")
    from harness import progress, reaper
    # in a pod (host network: the hostname is the node's) the pod name, from the downward API
    identity = args.identity or f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    log_file = Path(args.log_file) if args.log_file else progress.artifacts_dir() / f"capi-controller-{identity}.jsonl"
    progress.configure(verbose=not args.quiet, json_path=log_file)
    for name in ("harness.capi", "harness.capi.leader", "harness.kubeadm", "harness.controller"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    lease_ns = args.lease_namespace or args.namespace or "default"
    mgmt = ManagementCluster(None if args.in_cluster else args.kubeconfig)
    stop = threading.Event()

    def lost() -> None:
        # stop acting now; if the main thread is stuck in a call, exit before the lease expires
        stop.set()
        import _thread
        _thread.interrupt_main()
        deadline = elector.deadline()
        def hard_exit() -> None:
            wait = max(0.0, (deadline or time.monotonic()) - time.monotonic() - 1.0)
            time.sleep(wait)
            log.error("leadership lost and the reconcile did not stop in time: exiting",
                      extra={"phase": "leader-election"})
            logging.shutdown()
            os._exit(1)
        threading.Thread(target=hard_exit, daemon=True).start()

    elector = LeaseElector(mgmt.api, args.lease_name, lease_ns, identity, lease_duration=args.lease_duration,
                           renew_deadline=args.renew_deadline, retry_period=args.retry_period, on_lost=lost)

    def on_signal(signum, frame):
        stop.set()
        raise Shutdown(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # Machines belong to the Cluster objects, not to this process: unless a
    # parent process is named (--owner-pid, e.g. a test session), they are
    # labelled keep so that no reaper removes them after a leader change.
    owner = reaper.current_owner(args.run_id, keep=args.keep or args.owner_pid is None, pid=args.owner_pid)
    from harness.kubeadm.bootstrap import KubeadmBootstrapper
    rec = DockerMachineReconciler(mgmt, owner, namespace=args.namespace,
                                  bootstrapper=KubeadmBootstrapper(node_image=args.node_image),
                                  is_leader=elector.is_leader,
                                  internal_endpoint=args.workload_endpoint == "internal")
    log.info(f"controller {identity} starting: management {mgmt.kubeconfig}, namespace {args.namespace or '(all)'}, "
             f"Lease {lease_ns}/{args.lease_name}", extra={"phase": "start"})
    code = 0
    try:
        mgmt.ensure_namespace(lease_ns)  # the Lease's namespace (a fresh cluster may not have it yet)
        if not elector.acquire(stop):
            return 0
        elector.start_renewing()
        log.info(f"controller {identity} is the leader; reconciling", extra={"phase": "leader-election"})
        rec.run(stop, args.sync_period)
    except Shutdown as e:
        log.info(f"{e}: shutting down", extra={"phase": "stop"})
    except (NotLeader, KeyboardInterrupt):
        if elector.lost:
            log.error("leadership lost: exiting", extra={"phase": "leader-election"})
            code = 1
        else:
            log.info("interrupted: shutting down", extra={"phase": "stop"})
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if elector.release():
            log.info("Lease released", extra={"phase": "stop"})
        else:
            elector.stop()
    if elector.lost:  # however the main thread was interrupted (interrupt_main runs the SIGINT handler)
        log.error("exiting after losing the Lease", extra={"phase": "leader-election"})
        code = 1
    logging.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
