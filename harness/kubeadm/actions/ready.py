"""The ``ready`` action: CNI routes synced, every node Ready, every control
plane's static pods (etcd, apiserver, controller-manager, scheduler) Ready,
kube-proxy on every node, CoreDNS Ready."""
from __future__ import annotations

import logging
import time

from harness.progress import phase

from .. import cni
from . import cni as cni_action
from .command import kubelet_tails
from .context import ActionContext, KubeadmError

log = logging.getLogger("harness.kubeadm")

CONTROL_PLANE_COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


def run(ctx: ActionContext) -> None:
    cluster = ctx.cluster
    expected = {m.name for m in cluster.machines() if m.role in ("control-plane", "worker")}
    control_planes = {m.name for m in cluster.control_planes}
    cni_action.run(ctx, sorted(expected))
    with phase("nodes-ready", cluster=cluster.name):
        _wait_nodes_ready(ctx, expected, ctx.options.ready_timeout)
    with phase("system-pods", cluster=cluster.name):
        _wait_system_pods(ctx, expected, control_planes, ctx.options.ready_timeout)


def wait_system_pods(ctx: ActionContext) -> None:
    """kube-proxy on every machine, every control plane's static pods and CoreDNS Ready
    (for clusters another controller bootstrapped with kubeadm)."""
    cluster = ctx.cluster
    machines = {m.name for m in cluster.machines() if m.role in ("control-plane", "worker")}
    with phase("system-pods", cluster=cluster.name):
        _wait_system_pods(ctx, machines, {m.name for m in cluster.control_planes}, ctx.options.ready_timeout)


def _wait_nodes_ready(ctx: ActionContext, expected: set[str], timeout: float) -> None:
    from harness.waits import node_ready
    cluster = ctx.cluster
    end = time.monotonic() + timeout
    state: dict[str, str] = {n: "not registered" for n in expected}
    next_sync = time.monotonic() + 30
    while True:
        try:
            nodes = {n.metadata.name: n for n in cluster.core.list_node().items}
            state = {}
            for name in expected:
                n = nodes.get(name)
                if n is None:
                    state[name] = "not registered"
                elif not node_ready(n):
                    c = next((c for c in (n.status.conditions or []) if c.type == "Ready"), None)
                    state[name] = f"{c.reason}: {c.message}" if c else "no Ready condition"
            if not state:
                return
        except Exception as e:
            state = {"(api)": f"{type(e).__name__}: {str(e)[:200]}"}
        if time.monotonic() > end:
            break
        if time.monotonic() > next_sync:  # a node that restarted meanwhile
            next_sync = time.monotonic() + 30
            try:
                cni.sync_routes(cluster)
            except Exception as e:
                log.debug(f"cni sync while waiting: {e}")
        time.sleep(2)
    raise KubeadmError(f"cluster {cluster.namespace}/{cluster.name}: nodes not Ready after {timeout:.0f}s:\n"
                       + "\n".join(f"  {k}: {v}" for k, v in sorted(state.items()))
                       + kubelet_tails(cluster, [k for k in state if k != "(api)"]))


def _wait_system_pods(ctx: ActionContext, expected: set[str], control_planes: set[str],
                      timeout: float) -> None:
    cluster = ctx.cluster
    end = time.monotonic() + timeout
    problems: list[str] = []
    while True:
        problems = []
        try:
            static = {p.metadata.name: p for p in cluster.core.list_namespaced_pod(
                "kube-system", label_selector="tier=control-plane").items}
            for cp in sorted(control_planes):
                for c in CONTROL_PLANE_COMPONENTS:
                    pod = static.get(f"{c}-{cp}")
                    if pod is None or not _pod_ready(pod):
                        problems.append(f"{c} on {cp}: {_pod_state(pod) if pod else 'no mirror pod'}")
            dns = cluster.core.list_namespaced_pod("kube-system", label_selector="k8s-app=kube-dns").items
            if not dns:
                problems.append("no CoreDNS pods (k8s-app=kube-dns)")
            for pod in dns:
                if not _pod_ready(pod):
                    problems.append(f"CoreDNS {pod.metadata.name} on {pod.spec.node_name or '-'}: "
                                    f"{_pod_state(pod)}")
            proxies = cluster.core.list_namespaced_pod("kube-system", label_selector="k8s-app=kube-proxy").items
            on = {p.spec.node_name for p in proxies if _pod_ready(p)}
            for n in sorted(expected - on):
                problems.append(f"kube-proxy not Running on {n}")
        except Exception as e:
            problems.append(f"{type(e).__name__}: {str(e)[:200]}")
        if not problems:
            return
        if time.monotonic() > end:
            break
        time.sleep(2)
    raise KubeadmError(f"cluster {cluster.namespace}/{cluster.name}: system pods not ready after "
                       f"{timeout:.0f}s:\n" + "\n".join(f"  {p}" for p in problems))


def _pod_ready(pod) -> bool:
    if (pod.status.phase or "") != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def _pod_state(pod) -> str:
    st = pod.status.phase or "?"
    for cs in pod.status.container_statuses or []:
        w = cs.state.waiting if cs.state else None
        if w:
            st += f" ({cs.name}: {w.reason}: {(w.message or '')[:120]})"
    for c in pod.status.conditions or []:
        if c.status != "True" and c.message:
            st += f" [{c.type}: {c.message[:120]}]"
    return st
