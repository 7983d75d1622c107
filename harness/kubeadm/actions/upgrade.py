"""The ``upgrade`` action: kubeadm upgrade of a running cluster by one minor version, as kinder's
upgrade action does: new images and kubeadm onto every node, ``kubeadm
upgrade apply`` on the first control plane, ``kubeadm upgrade node`` on the
rest, then the new kubelet and kubectl, node by node."""
from __future__ import annotations

import logging

from harness.build import images, kube
from harness.cluster import Cluster
from harness.images_load import load_images
from harness.progress import phase
from harness.versions import VERSION_RE
from harness.waits import node_ready, until

from .. import preflight

log = logging.getLogger("harness.upgrade")


class UpgradeError(RuntimeError):
    pass


def check_skew(current: str, target: str) -> None:
    c, t = VERSION_RE.match(current), VERSION_RE.match(target)
    if not c or not t:
        raise UpgradeError(f"upgrade target {target!r}; allowed: vMAJOR.MINOR.PATCH")
    cm, tm = int(c.group(2)), int(t.group(2))
    if tm not in (cm, cm + 1) or (tm == cm and int(t.group(3)) <= int(c.group(3))):
        raise UpgradeError(f"upgrade target {target}; allowed: a newer patch of v1.{cm} or a v1.{cm + 1}.x "
                           f"release (kubeadm upgrades one minor version at a time; cluster is {current})")


def _install(cluster: Cluster, machine, bindir, names) -> None:
    for n in names:
        data = (bindir / n).read_bytes()
        cluster.provider.copy_to(machine, f"/usr/bin/{n}.new", data, mode=0o755)
        cluster.exec(machine, ["mv", "-f", f"/usr/bin/{n}.new", f"/usr/bin/{n}"])


def upgrade(cluster: Cluster, target: str, timeout: float = 900) -> None:
    current = cluster.spec.version
    check_skew(current, target)
    kd = kube.build_kubernetes(target)
    tags = images.build_component_images(target, kd)
    bindir = kd / "bin"
    cps, workers = cluster.control_planes, cluster.workers
    with phase("upgrade-prepare", cluster=cluster.name, machine=target):
        load_images(cluster, tags)
        for m in cps + workers:
            _install(cluster, m, bindir, ["kubeadm"])
    first, others = cps[0], cps[1:]
    pf = preflight.args(preflight.cgroup_v1(cluster, first))
    with phase("upgrade-apply", cluster=cluster.name, machine=first.name):
        r = cluster.exec(first, ["kubeadm", "upgrade", "apply", "-y", target, *pf, "--v=1"], check=False,
                         timeout=timeout)
        if not r.ok:
            raise UpgradeError(f"kubeadm upgrade apply {target} on {first.name} failed:\n{(r.stdout + r.stderr)[-4000:]}")
    for m in others + workers:
        with phase("upgrade-node", cluster=cluster.name, machine=m.name):
            r = cluster.exec(m, ["kubeadm", "upgrade", "node", *pf], check=False, timeout=timeout)
            if not r.ok:
                raise UpgradeError(f"kubeadm upgrade node on {m.name} failed:\n{(r.stdout + r.stderr)[-4000:]}")
    for m in cps + workers:
        with phase("upgrade-kubelet", cluster=cluster.name, machine=m.name):
            _install(cluster, m, bindir, ["kubelet", "kubectl"])
            cluster.exec(m, "systemctl daemon-reload && systemctl restart kubelet")
            until(lambda: _node_at(cluster, m.name, target), 300, f"node {m.name} Ready at {target}")
    cluster.set_version(target)


def _node_at(cluster: Cluster, name: str, version: str) -> bool:
    n = cluster.core.read_node(name)
    return n.status.node_info.kubelet_version == version and node_ready(n)
