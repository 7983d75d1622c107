"""Workload clusters go before their management cluster.

When a management cluster the harness made is deleted (its session ends, or
the reaper removes a dead run's objects), the Cluster API Clusters in it are
deleted first, through its own controllers, so that the infrastructure they
made (CAPD's containers) goes too. Asked on a control-plane machine with
kubeadm's admin kubeconfig; a cluster without Cluster API's CRDs is left
alone.
"""
from __future__ import annotations

import logging
from typing import Iterable

from providers.base import Machine, MachineProvider, ProviderError

log = logging.getLogger("harness.capi")

KUBECTL = "kubectl --kubeconfig=/etc/kubernetes/admin.conf"
SCRIPT = (f"{KUBECTL} get crd clusters.cluster.x-k8s.io >/dev/null 2>&1 || exit 0; "
          f"{KUBECTL} get clusters.cluster.x-k8s.io -A --no-headers 2>/dev/null | grep -q . || exit 0; "
          f"echo deleting: $({KUBECTL} get clusters.cluster.x-k8s.io -A -o name | tr '\\n' ' '); "
          f"{KUBECTL} delete clusters.cluster.x-k8s.io --all --all-namespaces --wait --timeout=%ds")


def delete_workloads(provider: MachineProvider, machines: Iterable[Machine], timeout: int = 300) -> str:
    """Delete every Cluster API Cluster of the management cluster whose machines these
    are, and wait; returns what was said ("" when there was nothing to do). Never raises."""
    cps = [m for m in machines if m.role == "control-plane" and m.state == "running"]
    for m in cps:
        try:
            r = provider.exec(m, ["sh", "-c", SCRIPT % timeout], check=False, timeout=timeout + 30)
        except ProviderError as e:
            log.warning(f"{m.name}: deleting its Cluster API clusters failed: {e}")
            continue
        said = (r.stdout + r.stderr).strip()
        if r.exit_code == 0:
            if said:
                log.info(f"{m.name}: workload clusters deleted first: {said[:500]}",
                         extra={"machine": m.name, "phase": "capi-cleanup"})
            return said
        log.warning(f"{m.name}: deleting its Cluster API clusters exited {r.exit_code}: {said[-500:]}")
    return ""
