"""The ``kubeadm-config`` action: for more than one control plane the API
load balancer in front of them; the generated init config
(:mod:`harness.kubeadm.config`) and the CNI's files on the first control plane."""
from __future__ import annotations

import logging

from harness.cluster import Cluster
from harness.progress import phase
from providers.base import Machine

from .. import cni, preflight
from .. import config as kconfig
from .context import REMOTE_DIR, ActionContext

log = logging.getLogger("harness.kubeadm")

INIT_CONFIG = f"{REMOTE_DIR}/kubeadm-init.yaml"


def run(ctx: ActionContext, machine: Machine) -> None:
    """Sets ``ctx.params``, ``ctx.load_balancer`` and ``ctx.api_endpoint``."""
    cluster = ctx.cluster
    spec, p = cluster.spec, cluster.provider
    with phase("kubeadm-config", cluster=cluster.name, machine=machine.name):
        lb = None
        if spec.control_plane.replicas > 1:
            with phase("load-balancer", cluster=cluster.name):
                lb = ctx.update_load_balancer(cluster.control_planes)
        endpoint_machine = lb or machine
        host, hport = p.host_endpoint(endpoint_machine, kconfig.API_PORT)
        sans = [s for s in (endpoint_machine.name, endpoint_machine.ip, host) if s]
        cgroup_root = _cgroup_root(cluster, machine)
        cgroup_v1 = _cgroup_v1(cluster, machine)
        params = kconfig.Params(
            control_plane_endpoint=f"{endpoint_machine.name}:{kconfig.API_PORT}",
            token=kconfig.new_token(), certificate_key=kconfig.new_certificate_key(),
            cert_sans=tuple(sans), cgroup_root=cgroup_root, cgroup_v1=cgroup_v1)
        text = kconfig.init_config(spec, params, ctx.node(machine))
        p.copy_to(machine, INIT_CONFIG, text.encode(), mode=0o600)
        log.debug(f"kubeadm init config:\n{redact(text)}", extra={"cluster": cluster.name,
                                                                     "machine": machine.name})
        cni.install(cluster, machine)
    ctx.params, ctx.load_balancer, ctx.api_endpoint = params, lb, (host, hport)


def _cgroup_root(cluster: Cluster, m: Machine) -> str | None:
    """``/kubelet`` when the node runs in the host's cgroup namespace on
    cgroup v1 and its entrypoint prepared a kubelet.slice in every
    hierarchy (kind's fix-ups); otherwise None: with a private cgroup
    namespace the node's root cgroup is already its own."""
    script = (
        "set -e; [ ! -f /sys/fs/cgroup/cgroup.controllers ]; "
        # private cgroup namespace: the cpu controller path is "/"
        "p=$(grep -E '^[^:]*:([^:]*,)?cpu(,[^:]*)?:' /proc/self/cgroup | head -n1 | cut -d: -f3); "
        "[ \"$p\" != / ]; "
        "for h in $(findmnt -rn -o TARGET -t cgroup); do [ -d \"$h/kubelet.slice\" ]; done")
    r = cluster.provider.exec(m, ["bash", "-c", script], check=False, timeout=30)
    return "/kubelet" if r.ok else None


def _cgroup_v1(cluster: Cluster, m: Machine) -> bool:
    v1 = preflight.cgroup_v1(cluster, m)
    if v1:
        preflight.warn_cgroup_v1(cluster.name)
    return v1


def redact(text: str) -> str:
    """A kubeadm config without its token and certificate key."""
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith(("token:", "- token:", "certificateKey:")):
            line = line.split(":", 1)[0] + ": <redacted>"
        out.append(line)
    return "\n".join(out)
