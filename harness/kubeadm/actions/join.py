"""The ``join`` action: control planes one at a time (etcd grows one member
at a time; kubeadm's join of a stacked-etcd member is not safe concurrently),
with the certificate key of the uploaded certs; workers in parallel threads.
A token that expired or was deleted is re-created; certs older than
:data:`CERTS_MAX_AGE` are uploaded again."""
from __future__ import annotations

import concurrent.futures as cf
import logging
import time

from harness.progress import phase
from providers.base import Machine

from .. import cni, preflight
from .. import config as kconfig
from .command import kubeadm
from .context import REMOTE_DIR, ActionContext

log = logging.getLogger("harness.kubeadm")

JOIN_CONFIG = f"{REMOTE_DIR}/kubeadm-join.yaml"
#: uploaded certs are deleted by kubeadm after 2h; re-upload when older than this
CERTS_MAX_AGE = 3600
TOKEN_TTL = "24h0m0s"


def run(ctx: ActionContext, machines: list[Machine]) -> None:
    if not machines:
        return
    params = join_params(ctx)
    cps = sorted((m for m in machines if m.role == "control-plane"), key=lambda m: m.name)
    workers = sorted((m for m in machines if m.role != "control-plane"), key=lambda m: m.name)
    joined: list[Machine] = []
    if cps:
        params = _ensure_certs(ctx, params, exclude={m.name for m in machines})
        for m in cps:  # one etcd member at a time
            _join_one(ctx, m, params)
            joined.append(m)
            st = ctx.saved_state()
            if st and st.load_balancer:
                members = [c for c in ctx.cluster.control_planes if c.name not in {x.name for x in cps}
                           or c.name in {x.name for x in joined}]
                ctx.update_load_balancer(members)
    if workers:
        n = max(1, min(ctx.options.join_parallelism, len(workers)))
        with cf.ThreadPoolExecutor(max_workers=n, thread_name_prefix="kubeadm-join") as ex:
            futs = {ex.submit(_join_one, ctx, m, params): m for m in workers}
            errors = []
            for f in cf.as_completed(futs):
                try:
                    f.result()
                except BaseException as e:
                    errors.append(e)
        if errors:
            if len(errors) > 1:
                log.error(f"{len(errors)} worker joins failed", extra={"cluster": ctx.name})
            raise errors[0]


def _join_one(ctx: ActionContext, m: Machine, params: kconfig.Params) -> None:
    cluster, o = ctx.cluster, ctx.options
    role = "control-plane" if m.role == "control-plane" else "worker"
    with phase(f"kubeadm-join-{role}", cluster=cluster.name, machine=m.name):
        text = kconfig.join_config(cluster.spec, params, ctx.node(m))
        cluster.provider.copy_to(m, JOIN_CONFIG, text.encode(), mode=0o600)
        cni.install(cluster, m)
        kubeadm(ctx, m, ["join", f"--config={JOIN_CONFIG}", *preflight.args(params.cgroup_v1),
                         f"--v={o.verbosity}"], "join", o.join_timeout)


def join_params(ctx: ActionContext) -> kconfig.Params:
    """Join parameters: from the bootstrap state, repaired from the cluster
    where needed (a token that expired or was deleted is re-created)."""
    st = ctx.state()
    if not _token_exists(ctx, st.token):
        cp = ctx.existing_control_plane()
        with phase("kubeadm-token", cluster=ctx.name, machine=cp.name):
            kubeadm(ctx, cp, ["token", "create", st.token, f"--ttl={TOKEN_TTL}",
                              "--description=kube-harness join token"], "token", 120, stream=False)
    return kconfig.Params(control_plane_endpoint=st.control_plane_endpoint, token=st.token,
                          certificate_key=st.certificate_key or kconfig.new_certificate_key(),
                          cert_sans=tuple(st.cert_sans), ca_cert_hashes=tuple(st.ca_cert_hashes),
                          cgroup_root=st.cgroup_root, cgroup_v1=st.cgroup_v1)


def _ensure_certs(ctx: ActionContext, params: kconfig.Params, exclude: set[str]) -> kconfig.Params:
    """Re-upload the control-plane certs (kubeadm deletes them after 2h)."""
    st = ctx.state()
    if st.certificate_key == params.certificate_key and time.time() - st.certs_uploaded < CERTS_MAX_AGE:
        return params
    cp = ctx.existing_control_plane(exclude)
    with phase("kubeadm-upload-certs", cluster=ctx.name, machine=cp.name):
        kubeadm(ctx, cp, ["init", "phase", "upload-certs", "--upload-certs",
                          f"--certificate-key={params.certificate_key}"], "upload-certs", 180, stream=False)
    st.certificate_key, st.certs_uploaded = params.certificate_key, time.time()
    st.save(ctx.cluster)
    return params


def _token_exists(ctx: ActionContext, token: str) -> bool:
    from kubernetes.client.exceptions import ApiException
    tid = token.split(".")[0]
    try:
        ctx.cluster.core.read_namespaced_secret(f"bootstrap-token-{tid}", "kube-system")
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise
