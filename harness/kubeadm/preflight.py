"""kubeadm preflight in node containers, and what cgroup v1 hosts need.

Kubernetes 1.35+ refuses cgroup v1: the kubelet unless ``failCgroupV1:
false``, kubeadm's SystemVerification check as an error. On a cgroup v1 host
(detected on a node) the harness sets the first and skips the second, and
says so once. cgroup v2 hosts get nothing special.

The other ignored checks fail in any node container for reasons that do not
matter there (as kind, which skips preflight, and kinder, which ignores all):
the host's swap, bridge-nf-call-iptables in the container's view of /proc.
Every other check still fails the run, e.g. a preloaded image missing
(``imagePullPolicy: Never`` turns the pull into that check).
"""
from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("harness.kubeadm")

CONTAINER_IGNORES = ("Swap", "FileContent--proc-sys-net-bridge-bridge-nf-call-iptables")
CGROUP_V1_IGNORES = ("SystemVerification",)
#: exists on cgroup v2 only
CGROUP_V2_FILE = "/sys/fs/cgroup/cgroup.controllers"
#: true on cgroup v2; run on a machine
CGROUP_V2_TEST = ["test", "-f", CGROUP_V2_FILE]

_warned = threading.Event()


def host_cgroup_v1() -> bool:
    """Whether this host (where the harness runs) is cgroup v1."""
    return not os.path.exists(CGROUP_V2_FILE)


def cgroup_v1(cluster, machine) -> bool:
    """Whether ``machine`` sees cgroup v1."""
    return not cluster.provider.exec(machine, CGROUP_V2_TEST, check=False, timeout=30).ok


def ignores(cgroup_v1: bool) -> tuple[str, ...]:
    return CONTAINER_IGNORES + (CGROUP_V1_IGNORES if cgroup_v1 else ())


def args(cgroup_v1: bool) -> list[str]:
    """``kubeadm init|join|upgrade`` arguments for the preflight checks."""
    return ["--ignore-preflight-errors=" + ",".join(ignores(cgroup_v1))]


def warn_cgroup_v1(cluster_name: str) -> None:
    """One warning line per process."""
    if not _warned.is_set():
        _warned.set()
        log.warning("cgroup v1 host: the kubelet runs with failCgroupV1: false and kubeadm skips the "
                    "SystemVerification preflight check (Kubernetes 1.35+ deprecates cgroup v1; "
                    "cgroup v2 hosts need neither)", extra={"cluster": cluster_name, "phase": "cgroup-v1"})
