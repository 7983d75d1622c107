"""The ``cni`` action: once the given nodes have their podCIDRs, the CNI's
config, routes and masquerade rules synced on the machines (:mod:`harness.kubeadm.cni`)."""
from __future__ import annotations

import time

from harness.progress import phase

from .. import cni
from .context import ActionContext, KubeadmError

POD_CIDR_TIMEOUT = 120


def run(ctx: ActionContext, names: list[str]) -> None:
    """Wait for ``names``' podCIDRs, then sync every machine."""
    with phase("cni", cluster=ctx.name):
        wait_pod_cidrs(ctx, names, POD_CIDR_TIMEOUT)
        cni.sync_routes(ctx.cluster)


def wait_pod_cidrs(ctx: ActionContext, names: list[str], timeout: float) -> None:
    cluster = ctx.cluster
    end = time.monotonic() + timeout
    missing: list[str] = list(names)
    last = ""
    while time.monotonic() < end:
        try:
            have = {n.metadata.name: n.spec.pod_cidr for n in cluster.core.list_node().items}
            missing = [n for n in names if not have.get(n)]
            if not missing:
                return
        except Exception as e:  # apiserver (re)starting
            last = f"{type(e).__name__}: {str(e)[:200]}"
        time.sleep(1)
    raise KubeadmError(f"cluster {cluster.namespace}/{cluster.name}: nodes without spec.podCIDR after "
                       f"{timeout:.0f}s: {missing} (node not registered, or kube-controller-manager not "
                       f"allocating node CIDRs){'; last error: ' + last if last else ''}")
