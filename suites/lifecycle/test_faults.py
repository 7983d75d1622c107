"""Fault injection: the cluster recovers and objects written before survive."""
from __future__ import annotations

import time
import uuid

import pytest
from kubernetes import client

from harness.waits import nodes_state, until

pytestmark = [pytest.mark.cluster, pytest.mark.lifecycle, pytest.mark.slow]


@pytest.fixture
def marker(lc_cluster):
    """A ConfigMap written before the fault; must be there after recovery."""
    name = f"fault-marker-{uuid.uuid4().hex[:6]}"
    data = {"written": str(time.time())}
    lc_cluster.core.create_namespaced_config_map("default", client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=name), data=data))
    yield name, data
    try:
        lc_cluster.core.delete_namespaced_config_map(name, "default")
    except Exception:
        pass


def assert_survived(cluster, marker, timeout=240):
    name, data = marker
    cm = until(lambda: cluster.core.read_namespaced_config_map(name, "default"), timeout,
               f"ConfigMap {name} readable after the fault")
    assert cm.data == data


def test_stopped_worker_recovers(lc_cluster, marker):
    if not lc_cluster.workers:
        pytest.skip("no workers")
    w = lc_cluster.workers[0]
    lc_cluster.provider.stop_machine(w)
    until(lambda: nodes_state(lc_cluster).get(w.name) is False, 120, f"{w.name} NotReady after stop")
    lc_cluster.provider.start_machine(w)
    until(lambda: nodes_state(lc_cluster).get(w.name), 300, f"{w.name} Ready after start")
    assert_survived(lc_cluster, marker)


def _kill_static_pod_process(cluster, machine, proc: str) -> int:
    before = cluster.exec(machine, f"pgrep -x {proc}", check=False).stdout.split()
    assert before, f"no {proc} process on {machine.name}"
    cluster.exec(machine, f"pkill -9 -x {proc}")
    return int(before[0])


def _wait_restarted(cluster, machine, proc: str, old_pid: int, timeout=180) -> None:
    def restarted():
        pids = cluster.exec(machine, f"pgrep -x {proc}", check=False).stdout.split()
        return pids and int(pids[0]) != old_pid
    until(restarted, timeout, f"{proc} restarted by the kubelet on {machine.name}")


def test_killed_etcd_recovers_without_data_loss(lc_cluster, marker):
    cp = lc_cluster.control_planes[0]
    old = _kill_static_pod_process(lc_cluster, cp, "etcd")
    _wait_restarted(lc_cluster, cp, "etcd", old)
    assert_survived(lc_cluster, marker)
    # and the cluster still accepts writes
    name = f"after-etcd-{uuid.uuid4().hex[:6]}"
    until(lambda: lc_cluster.core.create_namespaced_config_map("default", client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=name), data={"a": "b"})), 120, "a write after etcd restart")
    lc_cluster.core.delete_namespaced_config_map(name, "default")


def test_restarted_apiserver_recovers(lc_cluster, marker):
    cp = lc_cluster.control_planes[0]
    old = _kill_static_pod_process(lc_cluster, cp, "kube-apiserver")
    _wait_restarted(lc_cluster, cp, "kube-apiserver", old)
    assert_survived(lc_cluster, marker)
    until(lambda: all(nodes_state(lc_cluster).values()), 180, "all nodes Ready after apiserver restart")
