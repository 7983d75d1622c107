"""Nodes and the kubeadm addons (kubernetes test/e2e_kubeadm: nodes_test.go,
dns_addon_test.go, proxy_addon_test.go)."""
from __future__ import annotations

import pytest

from harness.waits import node_ready

pytestmark = [pytest.mark.cluster]


def test_every_machine_is_a_ready_node(cluster, nodes):
    by_name = {n.metadata.name: n for n in nodes}
    machines = {m.name for m in cluster.machines()}
    assert set(by_name) == machines
    not_ready = [n for n, node in by_name.items() if not node_ready(node)]
    assert not not_ready, f"not Ready: {not_ready}"


def test_kubelet_and_proxy_versions(cluster, nodes):
    for n in nodes:
        info = n.status.node_info
        assert info.kubelet_version == cluster.spec.version, n.metadata.name
        assert info.container_runtime_version.startswith("containerd://"), info.container_runtime_version


def test_node_addresses_and_provider_id(cluster, nodes):
    """One InternalIP per IP family of the cluster, the machine's, primary first."""
    ips = {m.name: [m.address(f) for f in cluster.spec.ip_families] for m in cluster.machines()}
    for n in nodes:
        internal = [a.address for a in n.status.addresses if a.type == "InternalIP"]
        assert internal == ips[n.metadata.name], n.metadata.name
        assert n.spec.provider_id and n.metadata.name in n.spec.provider_id


def test_coredns_available(cluster):
    d = cluster.apps.read_namespaced_deployment("coredns", "kube-system")
    assert d.status.available_replicas == d.spec.replicas >= 1
    pods = cluster.core.list_namespaced_pod("kube-system", label_selector="k8s-app=kube-dns").items
    assert all(p.status.phase == "Running" for p in pods)
    svc = cluster.core.read_namespaced_service("kube-dns", "kube-system")
    assert {p.port for p in svc.spec.ports} == {53, 9153}
    cm = cluster.core.read_namespaced_config_map("coredns", "kube-system")
    assert cluster.spec.service_domain in cm.data["Corefile"]


def test_kube_proxy_on_every_node(cluster, nodes):
    ds = cluster.apps.read_namespaced_daemon_set("kube-proxy", "kube-system")
    assert ds.status.desired_number_scheduled == len(nodes)
    assert ds.status.number_ready == len(nodes)
    assert ds.status.updated_number_scheduled == len(nodes)
    pods = cluster.core.list_namespaced_pod("kube-system", label_selector="k8s-app=kube-proxy").items
    assert {p.spec.node_name for p in pods} == {n.metadata.name for n in nodes}
    for p in pods:
        assert p.spec.containers[0].image.endswith(f":{cluster.spec.version}")


def test_cni_config_and_routes(cluster):
    """Each node has the harness CNI config for its own podCIDRs and a route
    to every other node's podCIDR of each family through that node's address
    of the same family."""
    import json

    from harness.kubeadm import cni
    nets = {n.name: n for n in cni.node_networks(cluster)}
    for m in cluster.machines():
        conf = json.loads(cluster.exec(m, ["cat", cni.CONFLIST_PATH]).stdout)
        assert conf["plugins"][0]["ipam"]["ranges"] == [[{"subnet": c}] for c in nets[m.name].pod_cidr.split(",")]
        want = cni.desired_routes(m.name, nets.values())
        assert len(want) == (len(nets) - 1) * len(cluster.spec.ip_families)
        for family, cluster_cidr in zip(cluster.spec.ip_families, cluster.spec.pod_cidrs):
            routes = cluster.exec(m, ["ip", f"-{family}", "route", "show", "root", cluster_cidr]).stdout
            for cidr, via in want:
                if (":" in cidr) == (family == 6):
                    assert f"{cidr} via {via} " in routes + " ", f"{m.name}: no route {cidr} via {via}:\n{routes}"
