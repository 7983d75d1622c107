"""kubeadm's ConfigMaps and their RBAC (kubernetes test/e2e_kubeadm:
kubeadm_config_test.go, kubelet_config_test.go, networking_test.go)."""
from __future__ import annotations

import ipaddress

import pytest
import yaml
from kubernetes import client


pytestmark = [pytest.mark.cluster]

BOOTSTRAP_GROUP = "system:bootstrappers:kubeadm:default-node-token"


def test_kubeadm_config_matches_spec(cluster, cluster_configuration):
    cc, spec = cluster_configuration, cluster.spec
    assert cc["kind"] == "ClusterConfiguration"
    assert cc["apiVersion"] == "kubeadm.k8s.io/v1beta4"
    assert cc["kubernetesVersion"] == spec.version
    assert cc["clusterName"] == spec.name
    assert cc["networking"]["podSubnet"] == spec.pod_cidr
    assert cc["networking"]["serviceSubnet"] == spec.service_cidr
    assert cc["networking"]["dnsDomain"] == spec.service_domain
    host, _, port = cc["controlPlaneEndpoint"].rpartition(":")
    assert port == "6443"
    lb = cluster.load_balancer()
    assert host == (lb.name if spec.control_plane.replicas > 1 else cluster.control_planes[0].name)
    sans = cc["apiServer"]["certSANs"]
    assert "127.0.0.1" in sans and "localhost" in sans


def test_kubeadm_config_rbac(cluster, subject_access):
    rbac = client.RbacAuthorizationV1Api(cluster.api_client())
    rbac.read_namespaced_role("kubeadm:nodes-kubeadm-config", "kube-system")
    rbac.read_namespaced_role_binding("kubeadm:nodes-kubeadm-config", "kube-system")
    for group in (BOOTSTRAP_GROUP, "system:nodes"):
        assert subject_access(user="kh-test", groups=[group], namespace="kube-system",
                              resource="configmaps", name="kubeadm-config"), group


def test_kubelet_config(cluster, subject_access):
    cm = cluster.core.read_namespaced_config_map("kubelet-config", "kube-system")
    kc = yaml.safe_load(cm.data["kubelet"])
    assert kc["kind"] == "KubeletConfiguration"
    assert kc["cgroupDriver"] == "systemd"
    assert kc["failSwapOn"] is False
    # only a cgroup v1 host needs it (Kubernetes 1.35+ refuses cgroup v1 otherwise)
    cgroup_v1 = not cluster.exec(cluster.control_planes[0], ["test", "-f", "/sys/fs/cgroup/cgroup.controllers"],
                                 check=False).ok
    assert kc.get("failCgroupV1") == (False if cgroup_v1 else None)
    assert kc["evictionHard"]["nodefs.available"] == "0%"
    assert kc["clusterDomain"] == cluster.spec.service_domain
    rbac = client.RbacAuthorizationV1Api(cluster.api_client())
    rbac.read_namespaced_role("kubeadm:kubelet-config", "kube-system")
    rbac.read_namespaced_role_binding("kubeadm:kubelet-config", "kube-system")
    for group in (BOOTSTRAP_GROUP, "system:nodes"):
        assert subject_access(user="kh-test", groups=[group], namespace="kube-system",
                              resource="configmaps", name="kubelet-config"), group


def test_kubelet_config_on_nodes(cluster):
    """Every kubelet runs with the generated settings (/var/lib/kubelet/config.yaml)."""
    for m in cluster.machines():
        kc = yaml.safe_load(cluster.exec(m, ["cat", "/var/lib/kubelet/config.yaml"]).stdout)
        assert kc["cgroupDriver"] == "systemd", m.name
        assert kc["imageGCHighThresholdPercent"] == 100, m.name


def test_kube_proxy_config(cluster):
    cm = cluster.core.read_namespaced_config_map("kube-proxy", "kube-system")
    kp = yaml.safe_load(cm.data["config.conf"])
    assert kp["mode"] == "iptables"
    assert kp["conntrack"]["maxPerCore"] == 0
    assert kp["clusterCIDR"] == cluster.spec.pod_cidr


def test_pod_cidrs_within_pod_subnet(cluster, nodes):
    net = ipaddress.ip_network(cluster.spec.pod_cidr)
    cidrs = []
    for n in nodes:
        assert n.spec.pod_cidr, f"{n.metadata.name} has no podCIDR"
        c = ipaddress.ip_network(n.spec.pod_cidr)
        assert c.subnet_of(net), f"{n.metadata.name}: {c} not in {net}"
        cidrs.append(c)
    assert len(set(cidrs)) == len(cidrs), "podCIDRs overlap"


def test_service_ip_within_service_subnet(cluster):
    svc = cluster.core.read_namespaced_service("kubernetes", "default")
    assert ipaddress.ip_address(svc.spec.cluster_ip) in ipaddress.ip_network(cluster.spec.service_cidr)
    dns = cluster.core.read_namespaced_service("kube-dns", "kube-system")
    assert ipaddress.ip_address(dns.spec.cluster_ip) in ipaddress.ip_network(cluster.spec.service_cidr)
