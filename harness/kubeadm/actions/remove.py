"""The ``remove`` action: take a machine out of the cluster before it is
deleted: drain, ``kubeadm reset`` (control planes: leaves etcd), etcd member
removal when reset could not do it (the machine is dead), load balancer
without it, Node deleted, CNI routes of the rest synced."""
from __future__ import annotations

import logging
import time

from harness.progress import phase
from providers.base import Machine

from .. import cni
from .. import config as kconfig
from .command import tail
from .context import ActionContext, KubeadmError

log = logging.getLogger("harness.kubeadm")


def run(ctx: ActionContext, machine: Machine) -> None:
    """Each step runs even if an earlier one failed; the first error is raised at the end."""
    cluster = ctx.cluster
    current = cluster.provider.get_machine(machine.name) or machine
    alive = current.state == "running"
    others = [c for c in cluster.control_planes if c.name != machine.name and c.state == "running"]
    run_on = others[0] if others else machine
    errors: list[BaseException] = []
    extra = {"cluster": cluster.name, "machine": machine.name}
    if alive:
        with phase("drain", cluster=cluster.name, machine=machine.name):
            try:
                r = cluster.kubectl("drain", machine.name, "--ignore-daemonsets", "--delete-emptydir-data",
                                    "--force", "--grace-period=10", "--timeout=120s", machine=run_on,
                                    check=False, timeout=180)
                if not r.ok and "not found" not in (r.stderr + r.stdout):
                    log.warning(f"drain {machine.name} failed: {tail(r.stderr or r.stdout, 5)}", extra=extra)
            except Exception as e:
                log.warning(f"drain {machine.name} failed: {e}", extra=extra)
    else:
        log.info(f"{machine.name} is {current.state}: not draining", extra=extra)
    if machine.role == "control-plane":
        if alive:
            with phase("kubeadm-reset", cluster=cluster.name, machine=machine.name):
                try:
                    r = cluster.provider.exec(machine, ["kubeadm", "reset", "-f", f"--v={ctx.options.verbosity}"],
                                              check=False, timeout=300)
                    if not r.ok:
                        log.warning(f"kubeadm reset on {machine.name} failed ({r.exit_code}): "
                                    f"{tail(r.stderr or r.stdout, 10)}", extra=extra)
                except Exception as e:
                    log.warning(f"kubeadm reset on {machine.name} failed: {e}", extra=extra)
        if others:
            try:
                advertised = machine.address(cluster.spec.ip_families[0])
                _remove_etcd_member(ctx, others[0], machine.name, advertised)
            except Exception as e:
                errors.append(e)
        st = ctx.saved_state()
        if st and st.load_balancer and others:
            try:
                ctx.update_load_balancer(others)
            except Exception as e:
                errors.append(e)
    with phase("delete-node", cluster=cluster.name, machine=machine.name):
        from kubernetes.client.exceptions import ApiException
        try:
            cluster.core.delete_node(machine.name)
        except ApiException as e:
            if e.status != 404:
                errors.append(e)
        except Exception as e:
            errors.append(e)
    rest = [m for m in cluster.machines() if m.name != machine.name]
    try:
        cni.sync_routes(cluster, rest)
    except Exception as e:
        log.warning(f"cni sync after removing {machine.name}: {e}", extra={"cluster": cluster.name})
    if errors:
        raise errors[0]


def _remove_etcd_member(ctx: ActionContext, via: Machine, name: str, ip: str = "") -> None:
    """``etcdctl member remove`` for a member kubeadm reset did not remove
    (the machine was dead). Uses the etcd static pod on ``via``."""
    cluster = ctx.cluster
    # the local API server, not the load balancer (which may still send
    # some connections to the member being removed)
    base = ["--server=https://127.0.0.1:6443", "--request-timeout=30s", "-n", "kube-system", "exec",
            f"etcd-{via.name}", "--", "etcdctl",
            f"--endpoints={kconfig.etcd_local_endpoint(cluster.spec)}", "--cacert=/etc/kubernetes/pki/etcd/ca.crt",
            "--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt",
            "--key=/etc/kubernetes/pki/etcd/healthcheck-client.key"]
    for attempt in range(6):
        r = cluster.kubectl(*base, "member", "list", machine=via, check=False, timeout=60)
        if r.ok:
            break
        time.sleep(5)
    if not r.ok:
        raise KubeadmError(f"etcd member list via {via.name} failed: {tail(r.stderr or r.stdout, 5)}")
    for line in r.stdout.splitlines():
        f = [x.strip() for x in line.split(",")]
        # ID, status, name, peer URLs, client URLs, learner; a member that never started has no name
        if len(f) >= 4 and (f[2] == name or (not f[2] and ip and (f"//{ip}:" in f[3] or f"//[{ip}]:" in f[3]))):
            log.info(f"removing etcd member {f[0]} ({name})", extra={"cluster": cluster.name,
                                                                     "phase": "etcd-member-remove"})
            rr = cluster.kubectl(*base, "member", "remove", f[0], machine=via, check=False, timeout=60)
            if not rr.ok:
                raise KubeadmError(f"etcd member remove {f[0]} ({name}) failed: {tail(rr.stderr, 5)}")
