"""Reaper: removes objects whose owning run is gone (crashed or killed
process, killed xdist worker). Objects are found by labels only."""
from __future__ import annotations

import logging
import os
import socket

import psutil

from providers.base import (L_CLUSTER, L_KEEP, L_NAMESPACE, L_OWNER_HOST, L_OWNER_PID, L_OWNER_START, L_RUN,
                            Cleanup, MachineProvider, Owner, require)

from .cluster import Cluster

log = logging.getLogger("harness.reaper")


def process_start(pid: int) -> int:
    return int(psutil.Process(pid).create_time())


def current_owner(run_id: str, keep: bool = False, pid: int | None = None) -> Owner:
    pid = pid or os.getpid()
    return Owner(run_id=run_id, pid=pid, host=socket.gethostname(), started=process_start(pid), keep=keep)


def owner_alive(labels: dict[str, str]) -> bool:
    """True unless the owning process on this host is certainly gone."""
    if labels.get(L_OWNER_HOST) != socket.gethostname():
        return True  # another host's run: not ours to judge
    try:
        pid = int(labels.get(L_OWNER_PID, "0"))
        started = int(labels.get(L_OWNER_START, "0"))
    except ValueError:
        return False
    if pid <= 0 or not psutil.pid_exists(pid):
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return not started or abs(int(proc.create_time()) - started) <= 1
    except psutil.NoSuchProcess:
        return False


def orphaned_runs(provider: MachineProvider) -> dict[str, list[dict]]:
    """run-id -> objects, for runs whose owner is dead and that are not kept."""
    runs: dict[str, list[dict]] = {}
    for obj in require(provider, Cleanup, needed_for="reaping the objects of dead runs").list_owned({}):
        labels = obj.get("labels") or {}
        run = labels.get(L_RUN)
        if not run or labels.get(L_KEEP) == "true" or owner_alive(labels):
            continue
        runs.setdefault(run, []).append(obj)
    return runs


def reap(provider: MachineProvider, only_pids: set[int] | None = None) -> list[str]:
    """Delete every object of dead runs; returns the deleted names."""
    deleted: list[str] = []
    for run, objs in orphaned_runs(provider).items():
        pids = {int(o["labels"].get(L_OWNER_PID, "0")) for o in objs}
        if only_pids is not None and not pids & only_pids:
            continue
        clusters = sorted({f"{o['labels'].get(L_NAMESPACE)}/{o['labels'].get(L_CLUSTER)}" for o in objs})
        log.warning(f"reaping run {run} (owner pid {sorted(pids)} is gone): clusters {clusters}",
                    extra={"phase": "reap"})
        from .capi.cleanup import delete_workloads  # a management cluster's workloads first
        delete_workloads(provider, provider.list_machines(selector={L_RUN: run}))
        deleted += provider.delete_owned({L_RUN: run})
        for c in clusters:
            ns, _, name = c.partition("/")
            Cluster.forget(name, ns)
    return deleted
