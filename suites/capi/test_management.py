"""Cluster API management mode against a real management cluster.

In order: leader election between two controller processes; a workload
Cluster (1 control plane, 1 worker) applied as CAPI objects and reconciled;
its nodes Ready through the ``<cluster>-kubeconfig`` Secret; the worker
MachineDeployment scaled to 2 and, after the leader is killed and the other
process has taken over, back to 1; the Cluster deleted and every one of its
containers gone. Steps depend on each other and run in file order.
"""
from __future__ import annotations

import signal
import time

import pytest

from harness.capi import L_CLUSTER_NAME
from harness.capi.management import ManagementCluster
from harness.progress import artifacts_dir, log
from harness.waits import node_ready, until
from providers.base import L_CLUSTER, L_NAMESPACE

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def state() -> dict:
    return {}


@pytest.fixture(scope="module")
def mgmt(capi_management: ManagementCluster, capi_controllers, capi_spec, capi_options) -> ManagementCluster:
    yield capi_management
    # whatever happened, leave no workload cluster behind
    try:
        if capi_management.get("Cluster", capi_spec.name, capi_spec.namespace) is not None:
            capi_management.pause(capi_spec.name, capi_spec.namespace, False)  # a failed pivot leaves it paused
            capi_management.delete_cluster(capi_spec.name, capi_spec.namespace, timeout=capi_options["timeout"])
    except Exception as e:
        log.error(f"cleanup of the workload cluster failed: {e}")
    try:
        capi_management.core.delete_namespace(capi_spec.namespace)
    except Exception:
        pass
    log.info(f"capi timings: {TIMINGS}")


def _need_harness(capi_controllers, what: str = "leader election") -> None:
    if capi_controllers is None:
        pytest.skip(f"external controllers: {what} is the harness controller's own (needs --capi-controllers harness)")


def test_one_leader(mgmt, capi_controllers):
    """Two controller processes: exactly one holds the Lease, the other waits."""
    _need_harness(capi_controllers)
    ids = {p.identity for p in capi_controllers.procs}
    t0 = time.monotonic()
    holder = until(lambda: capi_controllers.holder(), 60, "a controller to take the Lease", interval=0.5)
    TIMINGS["first-leader"] = round(time.monotonic() - t0, 1)
    assert holder in ids, f"Lease held by {holder!r}, not by one of {ids}"
    follower = capi_controllers.by_identity(next(i for i in ids if i != holder))
    until(lambda: "following" in follower.log_text(), 30, f"{follower.identity} to report it follows", interval=0.5)
    time.sleep(3 * 1 + 1)  # a few retry periods: the follower must not take over a live lease
    assert capi_controllers.holder() == holder
    assert all(p.alive for p in capi_controllers.procs), [p.log_text()[-2000:] for p in capi_controllers.procs]
    assert "is the leader" not in follower.log_text()


def test_workload_cluster_reconciled(mgmt, capi_spec, capi_options, capi_extra_objects, state):
    t0 = time.monotonic()
    mgmt.create_cluster(capi_spec, infra=capi_options["infra"], extra_objects=capi_extra_objects)
    mgmt.wait_ready(capi_spec.name, capi_spec.namespace, timeout=capi_options["timeout"])
    TIMINGS["provision"] = round(time.monotonic() - t0, 1)
    cl = mgmt.get("Cluster", capi_spec.name, capi_spec.namespace)
    assert cl["status"]["phase"] == "Provisioned"
    assert cl["status"]["infrastructureReady"] is True
    assert cl["spec"]["controlPlaneEndpoint"]["host"] and cl["spec"]["controlPlaneEndpoint"]["port"]
    machines = mgmt.list("Machine", capi_spec.namespace, {L_CLUSTER_NAME: capi_spec.name})
    assert len(machines) == 2
    for m in machines:
        assert m["status"]["phase"] == "Running" and m["status"]["nodeRef"]["name"]
        assert m["spec"]["providerID"]
        assert m["status"]["bootstrapReady"] and m["status"]["infrastructureReady"]
    state["workload"] = mgmt.workload(capi_spec)


def _ready_nodes(workload) -> dict[str, bool]:
    return {n.metadata.name: node_ready(n) for n in workload.core.list_node().items}


def test_workload_nodes_ready(mgmt, capi_spec, state):
    """The kubeconfig Secret reaches the workload API; every node is Ready."""
    w = state["workload"]
    nodes = until(lambda: (lambda n: n if len(n) == 2 and all(n.values()) else None)(_ready_nodes(w)),
                  300, "2 Ready nodes in the workload cluster")
    names = {m["status"]["nodeRef"]["name"]
             for m in mgmt.list("Machine", capi_spec.namespace, {L_CLUSTER_NAME: capi_spec.name})}
    assert set(nodes) == names


def test_scale_up(mgmt, capi_spec, capi_options, state):
    md = f"{capi_spec.name}-md-0"
    t0 = time.monotonic()
    mgmt.scale(capi_spec.name, capi_spec.namespace, md, 2, timeout=capi_options["timeout"])
    TIMINGS["scale-up"] = round(time.monotonic() - t0, 1)
    until(lambda: (lambda n: len(n) == 3 and all(n.values()))(_ready_nodes(state["workload"])), 300,
          "3 Ready nodes after scaling md-0 to 2")
    st = mgmt.get("MachineDeployment", md, capi_spec.namespace)["status"]
    assert st["replicas"] == st["readyReplicas"] == st["availableReplicas"] == st["updatedReplicas"] == 2


def test_leader_failover(mgmt, capi_controllers, state):
    """Kill -9 the leader: the other process takes the Lease once it expires."""
    _need_harness(capi_controllers)
    old = capi_controllers.holder()
    leader = capi_controllers.by_identity(old)
    other = next(p for p in capi_controllers.procs if p.identity != old)
    leader.kill(signal.SIGKILL)
    t0 = time.monotonic()
    new = until(lambda: (lambda h: h if h and h != old else None)(capi_controllers.holder()),
                capi_controllers.lease_duration * 3 + 10, "the follower to take over the Lease", interval=0.5)
    TIMINGS["failover"] = round(time.monotonic() - t0, 1)
    assert new == other.identity and other.alive
    # not before the lease could expire: the follower waited out the dead leader's lease
    assert TIMINGS["failover"] >= capi_controllers.lease_duration - 4, TIMINGS["failover"]
    until(lambda: "is the leader" in other.log_text(), 30, f"{other.identity} to start reconciling")
    state["new_leader"] = other


def test_scale_down_by_new_leader(mgmt, capi_spec, capi_options, capi_controllers, state):
    md = f"{capi_spec.name}-md-0"
    before = {m["metadata"]["name"] for m in mgmt.list("Machine", capi_spec.namespace,
                                                        {L_CLUSTER_NAME: capi_spec.name})}
    t0 = time.monotonic()
    mgmt.scale(capi_spec.name, capi_spec.namespace, md, 1, timeout=capi_options["timeout"])
    TIMINGS["scale-down"] = round(time.monotonic() - t0, 1)
    after = {m["metadata"]["name"] for m in mgmt.list("Machine", capi_spec.namespace, {L_CLUSTER_NAME: capi_spec.name})}
    assert len(after) == 2 and after < before
    nodes = until(lambda: (lambda n: n if len(n) == 2 and all(n.values()) else None)(_ready_nodes(state["workload"])),
                  300, "2 Ready nodes after scaling md-0 back to 1")
    assert set(nodes) == after, "the removed machine's Node must be gone from the workload cluster"
    if capi_controllers is not None and "new_leader" in state:
        assert "scale-down" in state["new_leader"].log_text(), "the new leader did not do the scale-down"
    if capi_options["infra"].ours:
        gone = before - after
        assert not [m for m in state["workload"].provider.list_machines(capi_spec.name, capi_spec.namespace)
                    if m.name in gone], f"containers of {gone} still exist"


def test_pivot_self_managed_and_back(request, mgmt, capi_spec, capi_options, capi_controllers, state):
    """clusterctl-move-style pivot into the workload cluster itself; a
    controller run against it scales the cluster it runs on; then back."""
    _need_harness(capi_controllers, "pivoting with a controller that follows")
    from harness.capi.pivot import move
    from harness.plugin import run_id

    from .conftest import ControllerProcess
    w = state["workload"]
    target = ManagementCluster(w.kubeconfig_path)
    t0 = time.monotonic()
    r = move(mgmt, target, capi_spec.namespace, [capi_spec.name])
    TIMINGS["pivot"] = round(time.monotonic() - t0, 1)
    assert mgmt.get("Cluster", capi_spec.name, capi_spec.namespace) is None
    assert any(o.startswith("Machine/") for o in r.objects) and "Secret/kh-wl-kubeconfig" in r.objects
    moved = target.get("Cluster", capi_spec.name, capi_spec.namespace)
    assert moved["status"]["phase"] == "Provisioned" and not moved["spec"].get("paused")
    # the machines were not touched by the move
    assert len(w.provider.list_machines(capi_spec.name, capi_spec.namespace)) == 2
    ok, why = target.cluster_status(capi_spec.name, capi_spec.namespace)
    assert ok, why
    self_ctl = ControllerProcess(f"ctl-self-{capi_spec.namespace[-4:]}", str(w.kubeconfig_path), capi_spec.namespace,
                                 node_image=request.config.getoption("node_image"), run_id=run_id(request.config))
    try:
        until(lambda: target.lease_holder("kube-harness-docker-controller", capi_spec.namespace) == self_ctl.identity,
              60, "the self-hosted controller to lead", interval=0.5)
        t0 = time.monotonic()
        target.scale(capi_spec.name, capi_spec.namespace, f"{capi_spec.name}-md-0", 2,
                     timeout=capi_options["timeout"])
        TIMINGS["self-managed-scale-up"] = round(time.monotonic() - t0, 1)
        until(lambda: (lambda n: len(n) == 3 and all(n.values()))(_ready_nodes(w)), 300,
              "3 Ready nodes, scaled by the self-managed cluster")
        t0 = time.monotonic()
        move(target, mgmt, capi_spec.namespace, [capi_spec.name])
        TIMINGS["pivot-back"] = round(time.monotonic() - t0, 1)
    finally:
        self_ctl.stop()
    assert target.get("Cluster", capi_spec.name, capi_spec.namespace) is None
    mgmt.wait_ready(capi_spec.name, capi_spec.namespace, timeout=120)
    assert len(mgmt.list("Machine", capi_spec.namespace, {L_CLUSTER_NAME: capi_spec.name})) == 3


def test_pivot_in_cluster_controller(request, mgmt, capi_spec, capi_options, capi_controllers, state):
    """Pivot into the workload cluster and run the controller there as a
    Deployment (two replicas, Lease election in that cluster, the host's
    Docker socket): it scales the cluster it runs in; then back."""
    _need_harness(capi_controllers, "running the controller in the cluster")
    from harness.capi import deploy
    from harness.capi.pivot import move
    from harness.kubeadm.bootstrap import KubeadmBootstrapper
    w = state["workload"]
    target = ManagementCluster(w.kubeconfig_path)
    node_image = request.config.getoption("node_image") or KubeadmBootstrapper().image(w)
    move(mgmt, target, capi_spec.namespace, [capi_spec.name])
    try:
        t0 = time.monotonic()
        deploy.deploy(w, capi_spec.namespace, node_image=node_image)
        TIMINGS["in-cluster-deploy"] = round(time.monotonic() - t0, 1)
        holder = target.lease_holder("kube-harness-docker-controller", capi_spec.namespace)
        pods = [p.metadata.name for p in target.core.list_namespaced_pod(
            capi_spec.namespace, label_selector=f"app.kubernetes.io/name={deploy.NAME}").items]
        assert len(pods) == 2 and holder.split("_")[0] in pods
        t0 = time.monotonic()
        target.scale(capi_spec.name, capi_spec.namespace, f"{capi_spec.name}-md-0", 1,
                     timeout=capi_options["timeout"])
        TIMINGS["in-cluster-scale-down"] = round(time.monotonic() - t0, 1)
        until(lambda: (lambda n: len(n) == 2 and all(n.values()))(_ready_nodes(w)), 300,
              "2 Ready nodes, scaled by the controller running inside the cluster")
    finally:
        logs = deploy.pod_logs(target, capi_spec.namespace)
        (artifacts_dir() / "capi-in-cluster-controller.log").write_text(logs)
        deploy.undeploy(w, capi_spec.namespace)
        move(target, mgmt, capi_spec.namespace, [capi_spec.name], force=True)
    mgmt.wait_ready(capi_spec.name, capi_spec.namespace, timeout=120)
    assert len(mgmt.list("Machine", capi_spec.namespace, {L_CLUSTER_NAME: capi_spec.name})) == 2


def test_delete_cluster(mgmt, capi_spec, capi_options, state):
    t0 = time.monotonic()
    mgmt.delete_cluster(capi_spec.name, capi_spec.namespace, timeout=capi_options["timeout"])
    TIMINGS["delete"] = round(time.monotonic() - t0, 1)
    assert mgmt.get("Cluster", capi_spec.name, capi_spec.namespace) is None
    assert mgmt.list("Machine", capi_spec.namespace, {L_CLUSTER_NAME: capi_spec.name}) == []
    # the kubeconfig Secret is owned by the Cluster: the garbage collector removes it
    until(lambda: mgmt.secret(f"{capi_spec.name}-kubeconfig", capi_spec.namespace) is None, 120,
          "the kubeconfig Secret to be garbage-collected")
    if capi_options["infra"].ours:
        left = state["workload"].provider.list_owned({L_CLUSTER: capi_spec.name, L_NAMESPACE: capi_spec.namespace})
        assert left == [], f"objects of the workload cluster still exist: {left}"


def test_clean_shutdown_releases_the_lease(capi_controllers):
    """SIGTERM: the leader gives the Lease up (holder emptied) and exits 0,
    so a successor need not wait for it to expire."""
    _need_harness(capi_controllers)
    holder = capi_controllers.holder()
    proc = capi_controllers.by_identity(holder)
    t0 = time.monotonic()
    proc.kill(signal.SIGTERM)
    assert proc.proc.wait(60) == 0, proc.log_text()[-2000:]
    assert capi_controllers.holder() is None
    TIMINGS["release"] = round(time.monotonic() - t0, 1)
    assert "released Lease" in proc.log_text()
