"""``ManagementCluster``: drive a real Cluster API management cluster.

The harness installs CRDs, applies the rendered objects (server-side apply,
field manager ``kube-harness``) and waits for *any* machine controller to
reconcile them, looking only at Cluster API status fields:

* Cluster: ``status.phase == Provisioned``, ``status.infrastructureReady``
  and ``status.controlPlaneReady`` (without a ``spec.controlPlaneRef`` CAPI
  core never sets controlPlaneReady, so there the ``ControlPlaneInitialized``
  condition or every control-plane Machine Running counts instead);
* every MachineDeployment: ``status.readyReplicas == status.replicas ==
  spec.replicas``;
* every Machine of the cluster: ``status.phase == Running`` with a
  ``status.nodeRef``, as many as the MachineDeployments ask for;
* the Secret ``<cluster>-kubeconfig`` (key ``value``).

The handle returned is a :class:`harness.cluster.Cluster`: with the
harness's own Docker infrastructure kinds it uses the Docker provider (exec,
copy, logs work); with a provider author's kinds it gets a provider whose
machine list comes from the Machine objects and whose exec raises a clear
error.
"""
from __future__ import annotations

import base64
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from harness.cluster import Cluster
from harness.progress import phase
from harness.spec import ClusterSpec
from providers.base import ExecResult, Health, Machine, MachineProvider, MachineSpec, Owner, ProviderError

from . import (A_PAUSED, CAPI_API, INFRA_API, INFRA_CLUSTER_KIND, L_CLUSTER_NAME, L_CONTROL_PLANE,
               L_DEPLOYMENT_NAME)
from . import crds as crdmod
from .objects import HARNESS_DOCKER, InfraKinds, kubeconfig_secret_name, render, resource

log = logging.getLogger("harness.capi")
FIELD_MANAGER = "kube-harness"
APPLY = "application/apply-patch+yaml"


class ManagementError(RuntimeError):
    pass


class ReconcileTimeout(ManagementError, TimeoutError):
    pass


def _api_exception():
    from kubernetes.client.exceptions import ApiException
    return ApiException


def is_status(e: BaseException, *codes: int) -> bool:
    return isinstance(e, _api_exception()) and e.status in codes


class ManagementCluster:
    """A Cluster API management cluster reached through ``kubeconfig``."""

    def __init__(self, kubeconfig: str | os.PathLike | None, *, context: str | None = None,
                 field_manager: str = FIELD_MANAGER):
        """``kubeconfig=None``: the in-cluster service account (a controller pod)."""
        from kubernetes import client, config as kconfig
        if kubeconfig is None:
            cfg = client.Configuration()
            kconfig.load_incluster_config(client_configuration=cfg)
            self.kubeconfig = "(in-cluster)"
            self.api = client.ApiClient(cfg)
        else:
            self.kubeconfig = str(kubeconfig)
            if not Path(self.kubeconfig).is_file():
                raise ManagementError(f"management kubeconfig {self.kubeconfig}: no such file")
            self.api = kconfig.new_client_from_config(self.kubeconfig, context=context)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.ext = client.ApiextensionsV1Api(self.api)
        self.coordination = client.CoordinationV1Api(self.api)
        self.field_manager = field_manager

    @classmethod
    def of(cls, cluster: Cluster) -> "ManagementCluster":
        """A harness-made cluster as the management cluster."""
        return cls(cluster.kubeconfig_path)

    def __repr__(self) -> str:
        return f"<ManagementCluster {self.kubeconfig}>"

    # --- CRDs --------------------------------------------------------------
    def install_crds(self, version: str | None = None, *, ours: bool = True, timeout: float = 120) -> list[str]:
        """Server-side apply the Cluster API CRDs of ``version`` (and the
        harness's infrastructure CRDs) and wait until they are Established."""
        docs = crdmod.capi_crds(version) + (crdmod.harness_crds() if ours else [])
        return self.apply_crds(docs, timeout=timeout)

    def apply_crds(self, docs: Iterable[dict], timeout: float = 120) -> list[str]:
        names = []
        with phase("capi-crds", logger=log):
            for d in docs:
                self.ext.patch_custom_resource_definition(d["metadata"]["name"], d, field_manager=self.field_manager,
                                                          force=True, _content_type=APPLY)
                names.append(d["metadata"]["name"])
            end = time.monotonic() + timeout
            pending = set(names)
            while pending:
                for n in sorted(pending):
                    crd = self.ext.read_custom_resource_definition(n)
                    conds = {c.type: c.status for c in (crd.status.conditions or [])} if crd.status else {}
                    if conds.get("Established") == "True":
                        pending.discard(n)
                if pending and time.monotonic() > end:
                    raise ManagementError(f"CRDs not Established after {timeout:.0f}s: {sorted(pending)}")
                if pending:
                    time.sleep(0.5)
        return names

    def crds_installed(self, names: Sequence[str] = ("clusters.cluster.x-k8s.io", "machines.cluster.x-k8s.io",
                                                     "machinedeployments.cluster.x-k8s.io")) -> bool:
        for n in names:
            try:
                self.ext.read_custom_resource_definition(n)
            except Exception as e:
                if is_status(e, 404):
                    return False
                raise
        return True

    def read_crds(self, group_suffixes: Sequence[str] = ("cluster.x-k8s.io", "infrastructure.harness.k8s.io")
                  ) -> list[dict]:
        """The installed CRDs of these groups, as plain dicts (for pivot)."""
        out = []
        for c in self.ext.list_custom_resource_definition().items:
            if any(c.spec.group == g or c.spec.group.endswith("." + g) for g in group_suffixes):
                d = self.api.sanitize_for_serialization(c)
                out.append({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                            "metadata": {k: v for k, v in d["metadata"].items()
                                         if k in ("name", "labels", "annotations")},
                            "spec": d["spec"]})
        return out

    # --- generic object access ----------------------------------------------
    def ensure_namespace(self, ns: str) -> None:
        try:
            self.core.read_namespace(ns)
        except Exception as e:
            if not is_status(e, 404):
                raise
            try:
                self.core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            except Exception as e2:
                if not is_status(e2, 409):
                    raise

    def apply(self, objs: Iterable[Mapping[str, Any]], *, force: bool = True) -> list[dict]:
        """Server-side apply each object (Secrets through the core API)."""
        out = []
        for o in objs:
            meta = o["metadata"]
            if o["kind"] == "Secret":
                r = self.core.patch_namespaced_secret(meta["name"], meta["namespace"], dict(o),
                                                      field_manager=self.field_manager, force=force,
                                                      _content_type=APPLY)
                out.append(self.api.sanitize_for_serialization(r))
                continue
            g, v, plural = resource(o)
            r = self.custom.patch_namespaced_custom_object(g, v, meta["namespace"], plural, meta["name"], dict(o),
                                                           field_manager=self.field_manager, force=force,
                                                           _content_type=APPLY)
            if r is None:
                # the generated client only deserializes 200 answers; an apply that creates answers 201
                r = self.custom.get_namespaced_custom_object(g, v, meta["namespace"], plural, meta["name"])
            out.append(r)
        return out

    def get(self, kind: str, name: str, namespace: str, api_version: str | None = None) -> dict | None:
        g, v, plural = resource({"apiVersion": api_version, "kind": kind}) if api_version else resource(kind)
        try:
            return self.custom.get_namespaced_custom_object(g, v, namespace, plural, name)
        except Exception as e:
            if is_status(e, 404):
                return None
            raise

    def list(self, kind: str, namespace: str | None = None, selector: Mapping[str, str] | None = None,
             api_version: str | None = None) -> list[dict]:
        g, v, plural = resource({"apiVersion": api_version, "kind": kind}) if api_version else resource(kind)
        sel = ",".join(f"{k}={val}" if val else k for k, val in (selector or {}).items()) or None
        try:
            if namespace:
                r = self.custom.list_namespaced_custom_object(g, v, namespace, plural, label_selector=sel)
            else:
                r = self.custom.list_cluster_custom_object(g, v, plural, label_selector=sel)
        except Exception as e:
            if is_status(e, 404):  # CRD not installed
                return []
            raise
        items = r.get("items") or []
        for i in items:  # list items carry no apiVersion/kind
            i.setdefault("apiVersion", f"{g}/{v}")
            i.setdefault("kind", kind)
        return items

    def patch(self, obj: Mapping[str, Any], body: Mapping[str, Any], *, status: bool = False) -> dict:
        """JSON merge patch of ``obj`` (its status subresource with ``status``)."""
        g, v, plural = resource(obj)
        meta = obj["metadata"]
        fn = self.custom.patch_namespaced_custom_object_status if status else self.custom.patch_namespaced_custom_object
        return fn(g, v, meta["namespace"], plural, meta["name"], dict(body),
                  _content_type="application/merge-patch+json")

    def delete(self, obj: Mapping[str, Any], *, propagation: str = "Background") -> bool:
        g, v, plural = resource(obj)
        meta = obj["metadata"]
        try:
            if obj["kind"] == "Secret":
                self.core.delete_namespaced_secret(meta["name"], meta["namespace"])
            else:
                self.custom.delete_namespaced_custom_object(g, v, meta["namespace"], plural, meta["name"],
                                                            propagation_policy=propagation)
            return True
        except Exception as e:
            if is_status(e, 404):
                return False
            raise

    def secret(self, name: str, namespace: str) -> dict | None:
        try:
            return self.api.sanitize_for_serialization(self.core.read_namespaced_secret(name, namespace))
        except Exception as e:
            if is_status(e, 404):
                return None
            raise

    def lease_holder(self, name: str, namespace: str) -> str | None:
        try:
            lease = self.coordination.read_namespaced_lease(name, namespace)
        except Exception as e:
            if is_status(e, 404):
                return None
            raise
        return (lease.spec.holder_identity or None) if lease.spec else None

    # --- clusters ------------------------------------------------------------
    def create_cluster(self, spec: ClusterSpec, *, infra: InfraKinds = HARNESS_DOCKER,
                       extra_objects: Iterable[Mapping[str, Any]] = (), validate: bool = True) -> list[dict]:
        """Apply the Cluster API objects of ``spec`` (plus a provider's own
        infrastructure objects) in ``spec.namespace``; does not wait."""
        objs = list(extra_objects) + render(spec, infra)
        for o in objs:
            o["metadata"].setdefault("namespace", spec.namespace)
        if validate:
            self._validate(objs)
        self.ensure_namespace(spec.namespace)
        with phase("capi-apply", cluster=spec.name, logger=log):
            applied = self.apply(objs)
        log.info(f"applied {len(applied)} objects: " + ", ".join(f"{o['kind']}/{o['metadata']['name']}"
                                                                 for o in objs), extra={"cluster": spec.name})
        return applied

    def _validate(self, objs: Sequence[Mapping[str, Any]]) -> None:
        """Check objects against the CRD schemas installed in this cluster."""
        errors: list[str] = []
        cache: dict[tuple[str, str], dict] = {}
        for o in objs:
            if o["kind"] == "Secret":
                continue
            g, v, plural = resource(o)
            key = (g, plural)
            if key not in cache:
                try:
                    crd = self.ext.read_custom_resource_definition(f"{plural}.{g}")
                except Exception as e:
                    if is_status(e, 404):
                        raise ManagementError(f"CRD {plural}.{g} is not installed in the management cluster "
                                              f"(install_crds() installs the Cluster API and harness CRDs)") from None
                    raise
                cache[key] = self.api.sanitize_for_serialization(crd)
            errors += crdmod.validate_object(dict(o), [cache[key]])
        if errors:
            raise ManagementError("objects do not match the installed CRDs:\n  " + "\n  ".join(errors))

    def cluster_status(self, name: str, namespace: str) -> tuple[bool, str]:
        """(reconciled, what is still missing) for a Cluster."""
        cl = self.get("Cluster", name, namespace)
        if cl is None:
            return False, f"Cluster {namespace}/{name} does not exist"
        st = cl.get("status") or {}
        missing = []
        if st.get("phase") != "Provisioned":
            missing.append(f"Cluster phase {st.get('phase')!r} (want Provisioned)")
        if not st.get("infrastructureReady"):
            missing.append("Cluster infrastructureReady false")
        mds = [m for m in self.list("MachineDeployment", namespace) if m["spec"].get("clusterName") == name]
        machines = self.list("Machine", namespace, {L_CLUSTER_NAME: name})
        cp_machines = [m for m in machines if L_CONTROL_PLANE in (m["metadata"].get("labels") or {})]
        if not st.get("controlPlaneReady"):
            conds = {c.get("type"): c.get("status") for c in st.get("conditions") or []}
            no_ref = not cl["spec"].get("controlPlaneRef")
            cp_running = cp_machines and all(_machine_running(m) for m in cp_machines)
            if not (no_ref and (conds.get("ControlPlaneInitialized") == "True" or cp_running)):
                missing.append("Cluster controlPlaneReady false")
        want = 0
        for md in mds:
            r = int(md["spec"].get("replicas", 1))
            want += r
            ms = md.get("status") or {}
            if ms.get("readyReplicas", 0) != r or ms.get("replicas", 0) != r:
                missing.append(f"MachineDeployment {md['metadata']['name']}: replicas {ms.get('replicas', 0)}, "
                               f"ready {ms.get('readyReplicas', 0)} (want {r})")
        live = [m for m in machines if not m["metadata"].get("deletionTimestamp")]
        not_running = [m["metadata"]["name"] + f"({(m.get('status') or {}).get('phase')})"
                       for m in machines if not _machine_running(m)]
        if not_running:
            missing.append(f"Machines not Running with a nodeRef: {not_running}")
        if mds and len(live) != want:
            missing.append(f"{len(machines)} Machines (want {want})")
        if self.secret(kubeconfig_secret_name(name), namespace) is None:
            missing.append(f"Secret {kubeconfig_secret_name(name)} missing")
        return not missing, "; ".join(missing)

    def wait_ready(self, name: str, namespace: str, timeout: float = 900, interval: float = 3) -> None:
        """Wait until any controller has reconciled the Cluster (see module doc)."""
        end = time.monotonic() + timeout
        last = ""
        with phase("capi-reconcile", cluster=name, logger=log):
            while True:
                try:
                    ok, why = self.cluster_status(name, namespace)
                except Exception as e:  # API hiccups while the management cluster is busy
                    ok, why = False, f"{type(e).__name__}: {str(e)[:200]}"
                if ok:
                    return
                if why != last:
                    log.info(f"waiting: {why}", extra={"cluster": name, "phase": "capi-reconcile"})
                    last = why
                if time.monotonic() > end:
                    raise ReconcileTimeout(f"Cluster {namespace}/{name} not reconciled after {timeout:.0f}s: {why}")
                time.sleep(interval)

    def provision(self, spec: ClusterSpec, *, timeout: float = 900, infra: InfraKinds = HARNESS_DOCKER,
                  extra_objects: Iterable[Mapping[str, Any]] = ()) -> Cluster:
        """Apply, wait for reconciliation, and return the workload cluster."""
        self.create_cluster(spec, infra=infra, extra_objects=extra_objects)
        self.wait_ready(spec.name, spec.namespace, timeout=timeout)
        return self.workload(spec)

    def scale(self, cluster: str, namespace: str, deployment: str, replicas: int, *, wait: bool = True,
              timeout: float = 600) -> None:
        md = self.get("MachineDeployment", deployment, namespace)
        if md is None or md["spec"].get("clusterName") != cluster:
            raise KeyError(f"no MachineDeployment {namespace}/{deployment} of cluster {cluster}")
        with phase("capi-scale", cluster=cluster, machine=f"{deployment}={replicas}", logger=log):
            self.patch(md, {"spec": {"replicas": replicas}})
            if wait:
                self.wait_ready(cluster, namespace, timeout=timeout)

    def kubeconfig_of(self, name: str, namespace: str) -> str:
        s = self.secret(kubeconfig_secret_name(name), namespace)
        if s is None:
            raise ManagementError(f"no Secret {namespace}/{kubeconfig_secret_name(name)}: the cluster is not "
                                  f"provisioned yet (or its controller does not follow the CAPI kubeconfig convention)")
        return base64.b64decode(s["data"]["value"]).decode()

    def workload(self, spec: ClusterSpec, state_dir: Path | None = None) -> Cluster:
        """A handle on the workload cluster from its kubeconfig Secret."""
        from harness import reaper
        cl = self.get("Cluster", spec.name, spec.namespace)
        if cl is None:
            raise ManagementError(f"no Cluster {spec.namespace}/{spec.name}")
        iref = cl["spec"].get("infrastructureRef") or {}
        ours = iref.get("apiVersion") == INFRA_API and iref.get("kind") == INFRA_CLUSTER_KIND
        if ours:
            from providers import registry
            provider: MachineProvider = registry.get("docker", spec.provider_options)
        else:
            provider = ForeignMachines(self, spec.name, spec.namespace, f"{iref.get('kind')} ({iref.get('apiVersion')})")
        state = state_dir or Path(tempfile.gettempdir()) / "kube-harness" / "capi" / f"{spec.namespace}-{spec.name}"
        handle = Cluster(spec, provider, reaper.current_owner(os.environ.get("KUBE_HARNESS_RUN_ID", "capi")),
                         state_dir=state)
        kc = self.kubeconfig_of(spec.name, spec.namespace)
        fd = os.open(handle.kubeconfig_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(kc)
        handle.bootstrapped = True
        for md in self.list("MachineDeployment", spec.namespace):
            if md["spec"].get("clusterName") == spec.name and md["metadata"]["name"] in handle.deployments:
                handle.deployments[md["metadata"]["name"]].replicas = int(md["spec"].get("replicas", 1))
        return handle

    def pause(self, name: str, namespace: str, paused: bool = True) -> None:
        cl = self.get("Cluster", name, namespace)
        if cl is None:
            raise KeyError(f"no Cluster {namespace}/{name}")
        self.patch(cl, {"spec": {"paused": paused}, "metadata": {"annotations": {A_PAUSED: "" if paused else None}}})

    def delete_cluster(self, name: str, namespace: str, *, timeout: float = 600, interval: float = 3,
                       cleanup: bool = True) -> None:
        """Delete the Cluster and wait until its controller has removed every
        Machine (finalizers honoured) and the Cluster itself; then delete the
        rendered objects nothing owns (templates, bootstrap secrets)."""
        cl = self.get("Cluster", name, namespace)
        with phase("capi-delete", cluster=name, logger=log):
            if cl is not None:
                self.delete(cl)
            end = time.monotonic() + timeout
            while True:
                left = []
                cl = self.get("Cluster", name, namespace)
                if cl is not None:
                    left.append(f"Cluster (finalizers {cl['metadata'].get('finalizers')}, "
                                f"phase {(cl.get('status') or {}).get('phase')})")
                ms = self.list("Machine", namespace, {L_CLUSTER_NAME: name})
                if ms:
                    left.append(f"Machines {[m['metadata']['name'] for m in ms]}")
                if not left:
                    break
                if time.monotonic() > end:
                    raise ReconcileTimeout(f"Cluster {namespace}/{name} not deleted after {timeout:.0f}s: "
                                           + "; ".join(left))
                time.sleep(interval)
            if cleanup:
                for kind in ("MachineDeployment", "HarnessDockerMachineTemplate", "HarnessDockerMachine",
                             INFRA_CLUSTER_KIND):
                    for o in self.list(kind, namespace, {L_CLUSTER_NAME: name}):
                        self.delete(o)
                for s in self.core.list_namespaced_secret(namespace, label_selector=f"{L_CLUSTER_NAME}={name}").items:
                    try:
                        self.core.delete_namespaced_secret(s.metadata.name, namespace)
                    except Exception as e:
                        if not is_status(e, 404):
                            raise


def _machine_running(m: Mapping[str, Any]) -> bool:
    st = m.get("status") or {}
    return st.get("phase") == "Running" and bool(st.get("nodeRef")) and not m["metadata"].get("deletionTimestamp")


class ForeignMachines(MachineProvider):
    """Machines of another provider's controller, seen through their CAPI
    Machine objects: listing works, anything that needs the machine itself
    (exec, copy, logs, stop) raises a clear error."""

    name = "capi-foreign"

    def __init__(self, mgmt: ManagementCluster, cluster: str, namespace: str, infra: str):
        super().__init__({})
        self.mgmt, self.cluster, self.namespace, self.infra = mgmt, cluster, namespace, infra

    def _no(self, what: str):
        raise ProviderError(f"{what} is unavailable: the machines of cluster {self.namespace}/{self.cluster} are "
                            f"managed by another controller through {self.infra}; the harness has no provider for "
                            f"them (use the workload kubeconfig, or the harness's HarnessDocker kinds)")

    def list_machines(self, cluster: str | None = None, namespace: str | None = None,
                      selector: Mapping[str, str] | None = None) -> list[Machine]:
        out = []
        for m in self.mgmt.list("Machine", self.namespace, {L_CLUSTER_NAME: self.cluster}):
            labels = m["metadata"].get("labels") or {}
            st = m.get("status") or {}
            out.append(Machine(
                name=m["metadata"]["name"], cluster=self.cluster, namespace=self.namespace,
                role="control-plane" if L_CONTROL_PLANE in labels else "worker",
                deployment=labels.get(L_DEPLOYMENT_NAME, ""), provider_id=m["spec"].get("providerID", ""),
                state="running" if st.get("phase") == "Running" else str(st.get("phase", "unknown")).lower(),
                addresses=tuple(a["address"] for a in st.get("addresses") or [] if a.get("type") == "InternalIP"),
                labels=labels))
        return out

    def get_machine(self, name: str) -> Machine | None:
        return next((m for m in self.list_machines() if m.name == name), None)

    def ensure_infrastructure(self, cluster: str, namespace: str, owner: Owner) -> None:
        self._no("creating infrastructure")

    def delete_infrastructure(self, cluster: str, namespace: str) -> None:
        self._no("deleting infrastructure")

    def create_machine(self, spec: MachineSpec) -> Machine:
        self._no("creating a machine")

    def delete_machine(self, machine: Machine) -> None:
        self._no("deleting a machine (delete its Machine object instead)")

    def exec(self, machine: Machine, cmd: Sequence[str], **kw: Any) -> ExecResult:
        self._no(f"exec on {machine.name}")

    def copy_to(self, machine: Machine, dest: str, data: bytes, mode: int = 0o644) -> None:
        self._no(f"copy to {machine.name}")

    def copy_from(self, machine: Machine, src: str) -> bytes:
        self._no(f"copy from {machine.name}")

    def logs(self, machine: Machine) -> str:
        self._no(f"logs of {machine.name}")

    def health(self, machine: Machine) -> Health:
        m = self.get_machine(machine.name)
        return Health(running=bool(m and m.state == "running"), booted=bool(m and m.state == "running"),
                      detail="from the Machine object's phase")

    def stop_machine(self, machine: Machine) -> None:
        self._no(f"stopping {machine.name}")

    def start_machine(self, machine: Machine) -> Machine:
        self._no(f"starting {machine.name}")

    def list_owned(self, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        return []

    def delete_owned(self, selector: Mapping[str, str]) -> list[str]:
        return []
