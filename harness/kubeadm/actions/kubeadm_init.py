"""The ``kubeadm-init`` action: ``kubeadm init --upload-certs`` on the first
control plane, the bootstrap state saved, and the ``kubeconfig`` step:
admin.conf given to the Cluster with the server rewritten to the host endpoint."""
from __future__ import annotations

import logging
import time

import yaml

from harness.cluster import Cluster
from harness.progress import phase
from providers.base import Machine

from .. import config as kconfig
from .. import preflight
from .command import kubeadm
from .context import ADMIN_CONF, CA_CERT, ActionContext, BootstrapState
from .kubeadm_config import INIT_CONFIG

log = logging.getLogger("harness.kubeadm")


def run(ctx: ActionContext, machine: Machine) -> None:
    """After :mod:`.kubeadm_config` (``ctx.params``, ``ctx.api_endpoint``)."""
    cluster, params, o = ctx.cluster, ctx.params, ctx.options
    assert params is not None and ctx.api_endpoint is not None, "kubeadm_config runs first"
    with phase("kubeadm-init", cluster=cluster.name, machine=machine.name):
        kubeadm(ctx, machine, ["init", f"--config={INIT_CONFIG}", "--upload-certs", "--skip-token-print",
                               *preflight.args(params.cgroup_v1), f"--v={o.verbosity}"], "init", o.init_timeout)
    ca = cluster.provider.copy_from(machine, CA_CERT)
    BootstrapState(control_plane_endpoint=params.control_plane_endpoint, token=params.token,
                   certificate_key=params.certificate_key, certs_uploaded=time.time(),
                   ca_cert_hashes=[kconfig.ca_cert_hash(ca)], cert_sans=list(params.cert_sans),
                   cgroup_root=params.cgroup_root, cgroup_v1=params.cgroup_v1, init_machine=machine.name,
                   load_balancer=ctx.load_balancer.name if ctx.load_balancer else None).save(cluster)
    with phase("kubeconfig", cluster=cluster.name):
        write_kubeconfig(cluster, machine, ctx.api_endpoint)


def write_kubeconfig(cluster: Cluster, cp: Machine, hostport: tuple[str, int]) -> None:
    """The control plane's admin.conf, its server the host's endpoint, as the cluster's kubeconfig."""
    kc = yaml.safe_load(cluster.provider.copy_from(cp, ADMIN_CONF))
    host, port = hostport
    h = f"[{host}]" if ":" in host else host
    for c in kc.get("clusters") or []:
        c["cluster"]["server"] = f"https://{h}:{port}"
    cluster.set_kubeconfig(yaml.safe_dump(kc, sort_keys=False))
    log.info(f"kubeconfig {cluster.kubeconfig_path} -> https://{h}:{port}",
             extra={"cluster": cluster.name, "phase": "kubeconfig"})
