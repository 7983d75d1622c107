"""kubeadm upgrade by one minor version (v1.36.3 -> v1.37.2 by default) of a real cluster."""
from __future__ import annotations

import os

import pytest
from kubernetes import client

from harness.kubeadm.actions.upgrade import UpgradeError, check_skew, upgrade
from harness.versions import PREVIOUS_VERSION
from harness.waits import nodes_state

pytestmark = [pytest.mark.cluster, pytest.mark.lifecycle, pytest.mark.slow]
UPGRADE_FROM = os.environ.get("KUBE_HARNESS_UPGRADE_FROM", PREVIOUS_VERSION)


def test_skew_rules():
    check_skew("v1.36.3", "v1.37.2")
    check_skew("v1.37.1", "v1.37.2")
    for bad in ("v1.39.0", "v1.36.1", "v1.37.2", "latest"):  # two minors, downgrade, same, junk
        with pytest.raises(UpgradeError, match="allowed"):
            check_skew("v1.37.2", bad)


@pytest.mark.direct_mode  # the harness's own upgrade; Cluster API upgrades by the topology version (KCP rollout)
def test_upgrade_one_minor(cluster_factory, cluster_spec):
    target = cluster_spec.version
    doc = cluster_spec.to_dict()
    doc["metadata"]["name"] = f"{cluster_spec.name}-up"[:40]
    doc["spec"]["topology"]["version"] = UPGRADE_FROM
    doc["spec"]["topology"]["workers"] = {"machineDeployments": [{"name": "md-0", "replicas": 1}]}
    from harness.spec import parse
    cl = cluster_factory(parse(doc, "upgrade"))
    assert {n.status.node_info.kubelet_version for n in cl.core.list_node().items} == {UPGRADE_FROM}
    cl.core.create_namespaced_config_map("default", client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="before-upgrade"), data={"v": UPGRADE_FROM}))

    upgrade(cl, target)

    nodes = cl.core.list_node().items
    assert {n.status.node_info.kubelet_version for n in nodes} == {target}
    assert all(nodes_state(cl).values())
    pods = cl.core.list_namespaced_pod("kube-system", label_selector="tier=control-plane").items
    images = {c.image for p in pods for c in p.spec.containers if "kube-" in c.image}
    assert images and all(i.endswith(":" + target) for i in images), images
    cm = cl.kubectl("get", "cm", "-n", "kube-system", "kubeadm-config", "-o", "jsonpath={.data.ClusterConfiguration}")
    assert f"kubernetesVersion: {target}" in cm.stdout
    assert cl.core.read_namespaced_config_map("before-upgrade", "default").data == {"v": UPGRADE_FROM}
