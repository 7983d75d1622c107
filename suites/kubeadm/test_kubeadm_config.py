"""kubeadm's ConfigMaps hold what the spec asked for and what the harness
sets; that they exist, with their RBAC and subnets, is e2e_kubeadm's part."""
from __future__ import annotations

import pytest
import yaml

pytestmark = [pytest.mark.cluster]


def test_kubeadm_config_matches_spec(cluster, cluster_configuration):
    cc, spec = cluster_configuration, cluster.spec
    assert cc["kind"] == "ClusterConfiguration"
    assert cc["apiVersion"] == "kubeadm.k8s.io/v1beta4"
    assert cc["kubernetesVersion"] == spec.version
    assert cc["clusterName"] == spec.name
    assert cc["networking"]["podSubnet"] == spec.pod_cidr
    assert cc["networking"]["serviceSubnet"] == spec.service_cidr
    assert cc["networking"]["dnsDomain"] == spec.service_domain
    kc = yaml.safe_load(cluster.core.read_namespaced_config_map("kubelet-config", "kube-system").data["kubelet"])
    assert (kc["cgroupDriver"], kc["clusterDomain"]) == ("systemd", spec.service_domain)
    # kubeadm writes the endpoint into every control plane's kubeconfigs
    for m in cluster.control_planes:
        admin = yaml.safe_load(cluster.exec(m, ["cat", "/etc/kubernetes/admin.conf"]).stdout)
        assert admin["clusters"][0]["cluster"]["server"] == f"https://{cc['controlPlaneEndpoint']}", m.name


@pytest.mark.direct_mode
def test_harness_control_plane_endpoint(cluster, cluster_configuration):
    """The load balancer's name with several control planes, else the control plane's."""
    host, _, port = cluster_configuration["controlPlaneEndpoint"].rpartition(":")
    assert port == "6443"
    lb = cluster.load_balancer()
    assert host == (lb.name if cluster.spec.control_plane.replicas > 1 else cluster.control_planes[0].name)
    sans = cluster_configuration["apiServer"]["certSANs"]
    assert "127.0.0.1" in sans and "localhost" in sans


@pytest.mark.direct_mode
def test_harness_kubelet_settings(cluster):
    """What the harness sets for kubelets in node containers."""
    kc = yaml.safe_load(cluster.core.read_namespaced_config_map("kubelet-config", "kube-system").data["kubelet"])
    assert kc["failSwapOn"] is False
    # only a cgroup v1 host needs it (Kubernetes 1.35+ refuses cgroup v1 otherwise)
    cgroup_v1 = not cluster.exec(cluster.control_planes[0], ["test", "-f", "/sys/fs/cgroup/cgroup.controllers"],
                                 check=False).ok
    assert kc.get("failCgroupV1") == (False if cgroup_v1 else None)
    assert kc["evictionHard"]["nodefs.available"] == "0%"
    for m in cluster.machines():
        on_node = yaml.safe_load(cluster.exec(m, ["cat", "/var/lib/kubelet/config.yaml"]).stdout)
        assert on_node["imageGCHighThresholdPercent"] == 100, m.name


def test_kubelet_config_on_nodes(cluster):
    """Every kubelet runs with the cluster's settings (/var/lib/kubelet/config.yaml)."""
    kc = yaml.safe_load(cluster.core.read_namespaced_config_map("kubelet-config", "kube-system").data["kubelet"])
    for m in cluster.machines():
        on_node = yaml.safe_load(cluster.exec(m, ["cat", "/var/lib/kubelet/config.yaml"]).stdout)
        for key in ("cgroupDriver", "clusterDomain", "clusterDNS", "authentication", "authorization"):
            assert on_node.get(key) == kc.get(key), (m.name, key)


def test_kube_proxy_config(cluster):
    cm = cluster.core.read_namespaced_config_map("kube-proxy", "kube-system")
    kp = yaml.safe_load(cm.data["config.conf"])
    assert kp["clusterCIDR"] == cluster.spec.pod_cidr
    assert kp["mode"] in ("", "iptables", "ipvs", "nftables")


@pytest.mark.direct_mode
def test_harness_kube_proxy_settings(cluster):
    kp = yaml.safe_load(cluster.core.read_namespaced_config_map("kube-proxy", "kube-system").data["config.conf"])
    assert kp["mode"] == "iptables"
    assert kp["conntrack"]["maxPerCore"] == 0
