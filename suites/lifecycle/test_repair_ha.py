"""Control-plane members of an HA cluster of its own (configs/ha.yaml: 3
stacked-etcd control planes behind a load balancer, 1 worker): with one
member down the API keeps serving through the load balancer; the machine
controller replaces the dead member and etcd keeps its data; with two down
the API stops and comes back with them.

Automatic remediation (MachineHealthCheck, KubeadmControlPlane) is Cluster
API's job: suites/capi drives the real controllers."""
from __future__ import annotations

import time
import uuid

import pytest
from kubernetes import client

from harness.kubeadm.config import etcd_local_endpoint
from harness.spec import load
from harness.waits import nodes_state, until

pytestmark = [pytest.mark.cluster, pytest.mark.lifecycle, pytest.mark.slow]
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ha(lc_factory, cluster_spec):
    spec = load(ROOT / "configs" / "ha.yaml").with_overrides(
        name=f"{cluster_spec.name}-ha"[:40], version=cluster_spec.version)
    cl = lc_factory(spec)
    return cl, lc_factory.controller(cl)


def etcd_members(cluster, via) -> list[tuple[str, str]]:
    """(name, status) of every etcd member, asked through ``via``'s etcd pod."""
    r = cluster.kubectl("-n", "kube-system", "exec", f"etcd-{via.name}", "--", "etcdctl",
                        f"--endpoints={etcd_local_endpoint(cluster.spec)}", "--cacert=/etc/kubernetes/pki/etcd/ca.crt",
                        "--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt",
                        "--key=/etc/kubernetes/pki/etcd/healthcheck-client.key", "member", "list", timeout=60)
    return [(f[2].strip(), f[1].strip()) for f in (ln.split(",") for ln in r.stdout.splitlines()) if len(f) > 3]


def write_marker(cluster) -> tuple[str, dict]:
    name, data = f"ha-marker-{uuid.uuid4().hex[:6]}", {"written": str(time.time())}
    cluster.core.create_namespaced_config_map("default", client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=name), data=data))
    return name, data


def test_dead_control_plane_is_replaced(ha):
    cl, ctl = ha
    assert len(cl.control_planes) == 3
    marker, data = write_marker(cl)
    victim = cl.control_planes[-1]
    cl.provider.stop_machine(victim)  # the member dies: container stopped, etcd peer gone
    until(lambda: nodes_state(cl).get(victim.name) is False, 180, f"{victim.name} NotReady")
    # two of three members: quorum, and the load balancer sends requests to live API servers
    assert cl.core.read_namespaced_config_map(marker, "default").data == data
    created = ctl.remediate(cl, victim)
    assert [m.role for m in created] == ["control-plane"] and created[0].name != victim.name
    until(lambda: set(nodes_state(cl)) == {m.name for m in cl.machines()} and all(nodes_state(cl).values()),
          300, "every node Ready, no stale Node")
    names = {m.name for m in cl.control_planes}
    assert victim.name not in names and len(names) == 3
    members = until(lambda: etcd_members(cl, cl.control_planes[0]), 120, "etcd member list")
    assert {n for n, _ in members} == names, members  # the dead member was removed, the new one added
    assert all(s == "started" for _, s in members), members
    assert cl.core.read_namespaced_config_map(marker, "default").data == data


def test_quorum_loss_and_recovery(ha):
    """Two of three members down: etcd has no quorum and the API refuses to serve;
    the members come back, and with them the API and the data."""
    cl, _ = ha
    marker, data = write_marker(cl)
    down = cl.control_planes[1:]
    for m in down:
        cl.provider.stop_machine(m)
    try:
        r = cl.kubectl("get", "--raw", "/readyz", "--request-timeout=10s", machine=cl.control_planes[0],
                       check=False, timeout=60)
        assert not r.ok, r.stdout
    finally:
        for m in down:
            cl.provider.start_machine(m)
    until(lambda: all(nodes_state(cl).values()) and len(nodes_state(cl)) == len(cl.machines()), 420,
          "every node Ready after the members came back")
    assert until(lambda: cl.core.read_namespaced_config_map(marker, "default"), 120, "marker").data == data
