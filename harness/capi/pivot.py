"""Pivot, like ``clusterctl move``: move Cluster API objects from one
management cluster to another, e.g. into the workload cluster itself so that
it manages itself.

``move(source, target, namespace)``:

1. refuse unless every Cluster to move is Provisioned and every Machine
   Running with a nodeRef (``force=True`` skips that check), as clusterctl;
2. pause the Clusters on the source (``spec.paused: true`` and annotation
   ``cluster.x-k8s.io/paused``): their controller stops acting on them;
3. copy the CRDs installed in the source (Cluster API's and the harness's)
   to the target (server-side apply) and create the namespace;
4. copy the objects with their status, owners before dependants (Secrets,
   infrastructure cluster and templates, Cluster, MachineDeployments,
   MachineSets, Machines, infrastructure machines, MachineHealthChecks):
   uid/resourceVersion/managedFields dropped, ownerReferences re-pointed at
   the new owners' uids, finalizers kept, status written to the status
   subresource;
5. unpause the Clusters on the target;
6. on the source, drop every moved object's finalizers and then delete it,
   so no controller deletes the infrastructure (the machines keep running).

Then run the controller against the target
(``python -m harness.capi.controller --kubeconfig <target>``).
"""
from __future__ import annotations

import argparse
import copy
import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from harness.progress import phase

from . import A_PAUSED, INFRA_CLUSTER_KIND, INFRA_MACHINE_KIND, INFRA_TEMPLATE_KIND, L_CLUSTER_NAME
from .management import ManagementCluster, ManagementError, _machine_running, is_status
from .objects import resource

log = logging.getLogger("harness.capi")

#: owners before dependants
ORDER = ("Secret", INFRA_CLUSTER_KIND, INFRA_TEMPLATE_KIND, "Cluster", "MachineDeployment", "MachineSet",
         "Machine", INFRA_MACHINE_KIND, "MachineHealthCheck")
DROP_META = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "deletionTimestamp",
             "deletionGracePeriodSeconds", "selfLink")


class PivotError(ManagementError):
    pass


@dataclass
class MoveResult:
    clusters: list[str]
    objects: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"moved {len(self.objects)} objects of clusters {self.clusters}"


def _key(o: Mapping[str, Any]) -> tuple[str, str]:
    return o["kind"], o["metadata"]["name"]


def collect(source: ManagementCluster, namespace: str, clusters: Iterable[str] | None = None) -> tuple[list[str], list[dict]]:
    """The Clusters to move and all their objects, in ``ORDER``."""
    all_cl = source.list("Cluster", namespace)
    names = sorted(set(clusters) if clusters else {c["metadata"]["name"] for c in all_cl})
    missing = set(names) - {c["metadata"]["name"] for c in all_cl}
    if missing:
        raise PivotError(f"no Cluster {sorted(missing)} in namespace {namespace} of {source}")
    found: dict[tuple[str, str], dict] = {}

    def add(o: dict | None) -> None:
        if o is not None:
            found.setdefault(_key(o), o)

    for name in names:
        cl = source.get("Cluster", name, namespace)
        add(cl)
        iref = cl["spec"].get("infrastructureRef")
        if iref:
            add(source.get(iref["kind"], iref["name"], namespace, iref["apiVersion"]))
        sel = {L_CLUSTER_NAME: name}
        for kind in ("MachineDeployment", "MachineSet", "Machine", "MachineHealthCheck", INFRA_MACHINE_KIND,
                     INFRA_TEMPLATE_KIND, INFRA_CLUSTER_KIND):
            for o in source.list(kind, namespace, sel):
                add(o)
        for kind in ("MachineDeployment", "MachineSet", "Machine"):  # by clusterName too (labels are optional)
            for o in source.list(kind, namespace):
                if (o.get("spec") or {}).get("clusterName") == name:
                    add(o)
        for o in list(found.values()):
            tspec = ((o.get("spec") or {}).get("template") or {}).get("spec") or {}
            for ref in (tspec.get("infrastructureRef"), (o.get("spec") or {}).get("infrastructureRef")
                        if o["kind"] == "Machine" else None):
                if ref:
                    add(source.get(ref["kind"], ref["name"], namespace, ref["apiVersion"]))
        for s in source.core.list_namespaced_secret(namespace, label_selector=f"{L_CLUSTER_NAME}={name}").items:
            d = source.api.sanitize_for_serialization(s)
            d.update(apiVersion="v1", kind="Secret")
            add(d)
    rank = {k: i for i, k in enumerate(ORDER)}
    objs = sorted(found.values(), key=lambda o: (rank.get(o["kind"], len(ORDER)), o["metadata"]["name"]))
    return names, objs


def _clean(o: Mapping[str, Any], uids: Mapping[str, str]) -> dict:
    out = copy.deepcopy(dict(o))
    meta = out["metadata"]
    for k in DROP_META:
        meta.pop(k, None)
    refs = []
    for r in meta.get("ownerReferences") or []:
        if r.get("uid") in uids:
            refs.append({**r, "uid": uids[r["uid"]]})
    if refs:
        meta["ownerReferences"] = refs
    else:
        meta.pop("ownerReferences", None)
    out.pop("status", None)
    return out


def move(source: ManagementCluster, target: ManagementCluster, namespace: str,
         clusters: Iterable[str] | None = None, *, force: bool = False, copy_crds: bool = True) -> MoveResult:
    names, objs = collect(source, namespace, clusters)
    with phase("pivot", cluster=",".join(names), logger=log):
        if not force:
            problems = []
            for o in objs:
                if o["kind"] == "Cluster" and (o.get("status") or {}).get("phase") != "Provisioned":
                    problems.append(f"Cluster {o['metadata']['name']} is {(o.get('status') or {}).get('phase')}")
                if o["kind"] == "Machine" and not _machine_running(o):
                    problems.append(f"Machine {o['metadata']['name']} is not Running with a nodeRef")
            if problems:
                raise PivotError("not moving clusters that are still being reconciled: " + "; ".join(problems))
        for n in names:
            source.pause(n, namespace, True)
        log.info(f"paused {names} on the source", extra={"phase": "pivot"})
        objs = collect(source, namespace, names)[1]  # re-read: paused, fresh resourceVersions
        if copy_crds:
            target.apply_crds(source.read_crds())
        target.ensure_namespace(namespace)
        uids: dict[str, str] = {}
        result = MoveResult(names)
        for o in objs:
            body = _clean(o, uids)
            created = target.apply([body])[0]
            uids[o["metadata"]["uid"]] = created["metadata"]["uid"]
            if o.get("status") and o["kind"] != "Secret":
                created.setdefault("apiVersion", o["apiVersion"])
                created.setdefault("kind", o["kind"])
                target.patch(created, {"status": o["status"]}, status=True)
            result.objects.append(f"{o['kind']}/{o['metadata']['name']}")
        # owners created after their dependants (the kubeconfig Secret and the
        # infrastructure cluster are owned by the Cluster): point those refs now
        for o in objs:
            refs = o["metadata"].get("ownerReferences") or []
            if refs and any(r.get("uid") in uids for r in refs):
                new = [{**r, "uid": uids[r["uid"]]} for r in refs if r.get("uid") in uids]
                meta = o["metadata"]
                if o["kind"] == "Secret":
                    target.core.patch_namespaced_secret(meta["name"], meta["namespace"],
                                                        {"metadata": {"ownerReferences": new}},
                                                        _content_type="application/merge-patch+json")
                else:
                    target.patch(o, {"metadata": {"ownerReferences": new}})
        log.info(f"copied {len(objs)} objects to the target", extra={"phase": "pivot"})
        for n in names:
            target.pause(n, namespace, False)
        log.info(f"unpaused {names} on the target", extra={"phase": "pivot"})
        for o in reversed(objs):
            _remove_without_cleanup(source, o)
        log.info(f"removed {len(objs)} objects from the source (finalizers dropped first)", extra={"phase": "pivot"})
    return result


def _remove_without_cleanup(mgmt: ManagementCluster, o: Mapping[str, Any]) -> None:
    try:
        if o["kind"] == "Secret":
            if o["metadata"].get("finalizers"):
                mgmt.core.patch_namespaced_secret(o["metadata"]["name"], o["metadata"]["namespace"],
                                                  {"metadata": {"finalizers": None}},
                                                  _content_type="application/merge-patch+json")
        else:
            fresh = mgmt.get(o["kind"], o["metadata"]["name"], o["metadata"]["namespace"], o["apiVersion"])
            if fresh is None:
                return
            if fresh["metadata"].get("finalizers"):
                mgmt.patch(fresh, {"metadata": {"finalizers": None}})
        mgmt.delete(o)
    except Exception as e:
        if not is_status(e, 404):
            raise


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.capi.pivot", description="Move Cluster API objects "
                                "(like clusterctl move) from one management cluster to another.")
    p.add_argument("--from", dest="source", required=True, help="source management cluster kubeconfig")
    p.add_argument("--to", dest="target", required=True, help="target cluster kubeconfig")
    p.add_argument("--namespace", required=True)
    p.add_argument("--cluster", action="append", help="Cluster to move (repeat; default: all in the namespace)")
    p.add_argument("--force", action="store_true", help="move also clusters that are not fully reconciled")
    args = p.parse_args(argv)
    from harness import progress
    progress.configure()
    r = move(ManagementCluster(args.source), ManagementCluster(args.target), args.namespace, args.cluster,
             force=args.force)
    print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
