"""Scale a MachineDeployment up and down; replace a stopped machine."""
from __future__ import annotations

import pytest

from harness.waits import nodes_state, until

pytestmark = [pytest.mark.cluster, pytest.mark.lifecycle, pytest.mark.slow]


def worker_md(cluster):
    mds = [d for d in cluster.deployments.values() if d.role == "worker"]
    if not mds:
        pytest.skip("the spec has no worker MachineDeployment")
    return mds[0]


def test_scale_up_and_down(lc_cluster, lc_controller):
    md = worker_md(lc_cluster)
    before = {m.name for m in lc_cluster.machines(deployment=md.name)}
    created = lc_controller.scale(lc_cluster, md.name, md.replicas + 1)
    assert len(created) == 1
    new = created[0].name
    assert new not in before
    until(lambda: nodes_state(lc_cluster).get(new), 300, f"node {new} Ready")
    assert len(lc_cluster.machines(deployment=md.name)) == len(before) + 1

    lc_controller.scale(lc_cluster, md.name, md.replicas - 1)
    names = {m.name for m in lc_cluster.machines(deployment=md.name)}
    assert len(names) == len(before)
    gone = (before | {new}) - names
    assert len(gone) == 1
    until(lambda: not (set(nodes_state(lc_cluster)) & gone), 120, f"Node objects {gone} removed")
    assert all(nodes_state(lc_cluster).values())


def test_stopped_worker_is_remediated_on_demand(lc_cluster, lc_controller):
    """``remediate`` replaces a named machine at once (a MachineHealthCheck's action)."""
    md = worker_md(lc_cluster)
    victim = lc_cluster.machines(deployment=md.name)[0]
    lc_cluster.provider.stop_machine(victim)
    created = lc_controller.remediate(lc_cluster, victim)
    assert len(created) == 1 and created[0].name != victim.name
    assert nodes_state(lc_cluster).get(created[0].name)
    until(lambda: victim.name not in nodes_state(lc_cluster), 120, "old Node object removed")
    assert len(lc_cluster.machines(deployment=md.name)) == md.replicas


def test_scale_rejects_bad_replicas(lc_cluster, lc_controller):
    cp = next(d for d in lc_cluster.deployments.values() if d.role == "control-plane")
    with pytest.raises(ValueError, match="odd number"):
        lc_controller.scale(lc_cluster, cp.name, 2)
    with pytest.raises(KeyError, match="no MachineDeployment"):
        lc_controller.scale(lc_cluster, "nope", 1)
