"""kubeadm config generation (harness.kubeadm.config): pure, no cluster."""
from __future__ import annotations

import datetime
import hashlib
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.kubeadm import config as kc
from harness.spec import parse
from harness.versions import DEFAULT_VERSION

ROOT = Path(__file__).resolve().parent.parent


def spec(patches=None, cps=1, **net):
    doc = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    doc["spec"]["topology"]["controlPlane"]["replicas"] = cps
    doc["spec"]["clusterNetwork"].update(net)
    if patches:
        doc["spec"]["kubeadm"] = patches
    return parse(doc, "test", {"docker"})


def params(**kw):
    base = dict(control_plane_endpoint="kh-lb:6443", token="abcdef.0123456789abcdef",
                certificate_key="ab" * 32, cert_sans=("kh-lb", "172.18.0.9"),
                ca_cert_hashes=("sha256:" + "c" * 64,))
    base.update(kw)
    return kc.Params(**base)


CP = kc.Node("kh-control-plane-aaaaa", "172.18.0.2", True, {"tier": "cp"}, "kube-harness://docker/default/cp")
WORKER = kc.Node("kh-md-0-bbbbb", "172.18.0.3", False, {})


def docs(s=None, p=None, node=CP):
    return {d["kind"]: d for d in kc.init_documents(s or spec(), p or params(), node)}


def args(lst):
    return {a["name"]: a["value"] for a in lst}


def test_init_documents_and_order():
    out = kc.init_documents(spec(), params(), CP)
    assert [d["kind"] for d in out] == ["InitConfiguration", "ClusterConfiguration", "KubeletConfiguration",
                                        "KubeProxyConfiguration"]
    assert {d["apiVersion"] for d in out[:2]} == {"kubeadm.k8s.io/v1beta4"}
    text = kc.init_config(spec(), params(), CP)
    assert [d["kind"] for d in yaml.safe_load_all(text)] == [d["kind"] for d in out]


def test_cluster_configuration_from_spec():
    s = spec(pods="10.100.0.0/16", services="10.200.0.0/20", serviceDomain="kh.test")
    cc = docs(s)["ClusterConfiguration"]
    assert cc["kubernetesVersion"] == s.version == DEFAULT_VERSION
    assert cc["clusterName"] == "kh"
    assert cc["controlPlaneEndpoint"] == "kh-lb:6443"
    assert cc["imageRepository"] == "registry.k8s.io"
    assert cc["networking"] == {"podSubnet": "10.100.0.0/16", "serviceSubnet": "10.200.0.0/20",
                                "dnsDomain": "kh.test"}
    sans = cc["apiServer"]["certSANs"]
    for want in ("localhost", "127.0.0.1", "kh-lb", "172.18.0.9"):
        assert want in sans
    assert len(sans) == len(set(sans))
    cm = args(cc["controllerManager"]["extraArgs"])
    assert cm["allocate-node-cidrs"] == "true"
    assert cm["cluster-cidr"] == "10.100.0.0/16"
    assert docs(s)["KubeProxyConfiguration"]["clusterCIDR"] == "10.100.0.0/16"


def test_init_configuration_node_registration():
    ic = docs()["InitConfiguration"]
    assert ic["bootstrapTokens"][0]["token"] == "abcdef.0123456789abcdef"
    assert ic["bootstrapTokens"][0]["groups"] == [kc.TOKEN_GROUP]
    assert ic["certificateKey"] == "ab" * 32
    assert ic["localAPIEndpoint"] == {"advertiseAddress": "172.18.0.2", "bindPort": 6443}
    nr = ic["nodeRegistration"]
    assert nr["name"] == CP.name
    assert nr["criSocket"] == "unix:///run/containerd/containerd.sock"
    assert nr["imagePullPolicy"] == "Never"
    a = args(nr["kubeletExtraArgs"])
    assert a["node-ip"] == "172.18.0.2"
    assert a["provider-id"] == "kube-harness://docker/default/cp"
    assert a["node-labels"] == "tier=cp"
    assert "taints" not in nr  # kubeadm's default control-plane taint


def test_kubelet_and_proxy_container_settings():
    d = docs()
    k = d["KubeletConfiguration"]
    assert k["cgroupDriver"] == "systemd"
    assert k["failSwapOn"] is False
    assert "failCgroupV1" not in k  # cgroup v2: nothing special
    assert docs(p=params(cgroup_v1=True))["KubeletConfiguration"]["failCgroupV1"] is False
    assert k["imageGCHighThresholdPercent"] == 100
    assert k["evictionHard"] == {"nodefs.available": "0%", "nodefs.inodesFree": "0%", "imagefs.available": "0%"}
    assert "cgroupRoot" not in k
    assert docs(p=params(cgroup_root="/kubelet"))["KubeletConfiguration"]["cgroupRoot"] == "/kubelet"
    kp = d["KubeProxyConfiguration"]
    assert kp["mode"] == "iptables"
    assert kp["conntrack"]["maxPerCore"] == 0


def test_join_worker():
    j = kc.join_document(spec(), params(), WORKER)
    assert j["kind"] == "JoinConfiguration"
    assert "controlPlane" not in j
    bt = j["discovery"]["bootstrapToken"]
    assert bt == {"apiServerEndpoint": "kh-lb:6443", "token": "abcdef.0123456789abcdef",
                  "caCertHashes": ["sha256:" + "c" * 64]}
    assert j["nodeRegistration"]["taints"] == []
    assert args(j["nodeRegistration"]["kubeletExtraArgs"]) == {"node-ip": "172.18.0.3"}
    # no CA hash known: kubeadm must be told to skip verification explicitly
    j2 = kc.join_document(spec(), params(ca_cert_hashes=()), WORKER)
    assert j2["discovery"]["bootstrapToken"]["unsafeSkipCAVerification"] is True


def test_join_control_plane():
    node = kc.Node("kh-control-plane-ccccc", "172.18.0.4", True)
    j = kc.join_document(spec(cps=3), params(), node)
    assert j["controlPlane"] == {"localAPIEndpoint": {"advertiseAddress": "172.18.0.4", "bindPort": 6443},
                                 "certificateKey": "ab" * 32}
    assert "taints" not in j["nodeRegistration"]
    with pytest.raises(ValueError, match="certificate key"):
        kc.join_document(spec(cps=3), params(certificate_key=""), node)


def test_spec_patches_are_merged():
    s = spec({
        "clusterConfiguration": {
            "apiServer": {"extraArgs": {"v": 4, "enable-admission-plugins": "NodeRestriction"},
                          "certSANs": ["extra.example"]},
            "controllerManager": {"extraArgs": [{"name": "node-cidr-mask-size", "value": "25"},
                                                {"name": "enable-hostpath-provisioner", "value": None}]},
            "etcd": {"local": {"extraArgs": {"unsafe-no-fsync": True}}},
        },
        "initConfiguration": {"nodeRegistration": {"kubeletExtraArgs": {"v": "2"}}},
        "joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": {"node-ip": None}}},
        "kubeletConfiguration": {"maxPods": 50, "evictionHard": {"memory.available": "1%"}},
        "kubeProxyConfiguration": {"mode": "ipvs", "conntrack": None},
    })
    d = docs(s)
    cc = d["ClusterConfiguration"]
    assert args(cc["apiServer"]["extraArgs"]) == {"v": "4", "enable-admission-plugins": "NodeRestriction"}
    assert cc["apiServer"]["certSANs"] == ["extra.example"]  # plain lists replace
    cm = args(cc["controllerManager"]["extraArgs"])
    assert cm["node-cidr-mask-size"] == "25"
    assert "enable-hostpath-provisioner" not in cm
    assert cm["allocate-node-cidrs"] == "true"
    assert [a["name"] for a in cc["controllerManager"]["extraArgs"]][0] == "allocate-node-cidrs"  # order kept
    assert args(cc["etcd"]["local"]["extraArgs"]) == {"unsafe-no-fsync": "true"}
    assert cc["etcd"]["local"]["dataDir"] == "/var/lib/etcd"
    ka = args(d["InitConfiguration"]["nodeRegistration"]["kubeletExtraArgs"])
    assert ka["v"] == "2" and ka["node-ip"] == CP.ip
    k = d["KubeletConfiguration"]
    assert k["maxPods"] == 50
    assert k["evictionHard"]["memory.available"] == "1%" and k["evictionHard"]["nodefs.available"] == "0%"
    assert d["KubeProxyConfiguration"]["mode"] == "ipvs"
    assert "conntrack" not in d["KubeProxyConfiguration"]
    j = kc.join_document(s, params(), WORKER)
    assert "node-ip" not in args(j["nodeRegistration"]["kubeletExtraArgs"])


def test_patch_cannot_change_api_version():
    s = spec({"clusterConfiguration": {"apiVersion": "kubeadm.k8s.io/v1beta3"}})
    with pytest.raises(ValueError, match="v1beta4"):
        kc.init_documents(s, params(), CP)


def test_merge_rules():
    assert kc.merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3, "d": 4}}) == {"a": {"b": 1, "c": 3, "d": 4}}
    assert kc.merge({"a": 1, "b": 2}, {"a": None}) == {"b": 2}
    assert kc.merge({"l": [1, 2]}, {"l": [3]}) == {"l": [3]}
    base = {"extraVolumes": [{"name": "x", "hostPath": "/a"}]}
    got = kc.merge(base, {"extraVolumes": [{"name": "x", "hostPath": "/b"}, {"name": "y", "hostPath": "/c"}]})
    assert got == {"extraVolumes": [{"name": "x", "hostPath": "/b"}, {"name": "y", "hostPath": "/c"}]}
    assert base == {"extraVolumes": [{"name": "x", "hostPath": "/a"}]}  # inputs untouched
    assert kc.merge({}, {"extraArgs": {"a": True}}) == {"extraArgs": [{"name": "a", "value": "true"}]}


def test_tokens_and_params_validation():
    for _ in range(20):
        assert kc.TOKEN_RE.match(kc.new_token())
    assert len(kc.new_certificate_key()) == 64
    with pytest.raises(ValueError, match="token"):
        params(token="nope")
    with pytest.raises(ValueError, match="host:port"):
        params(control_plane_endpoint="kh-lb")
    with pytest.raises(ValueError, match="certificate key"):
        params(certificate_key="xyz")


def test_ca_cert_hash_is_sha256_of_spki():
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    spki = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert kc.ca_cert_hash(pem) == "sha256:" + hashlib.sha256(spki).hexdigest()


def _kubeadm() -> str:
    """The harness-built kubeadm (cached; built by ci/setup.sh), or $KUBE_HARNESS_KUBEADM."""
    if os.environ.get("KUBE_HARNESS_KUBEADM"):
        return os.environ["KUBE_HARNESS_KUBEADM"]
    from harness.build import kube
    return str(kube.build_kubernetes() / "bin" / "kubeadm")


@pytest.mark.parametrize("which", ["init", "join-worker", "join-control-plane"])
def test_kubeadm_accepts_the_config(tmp_path, which):
    s = spec({"clusterConfiguration": {"apiServer": {"extraArgs": {"v": "2"}}}}, cps=3)
    if which == "init":
        text = kc.init_config(s, params(), CP)
    else:
        text = kc.join_config(s, params(), WORKER if which == "join-worker" else CP)
    f = tmp_path / "kubeadm.yaml"
    f.write_text(text)
    r = subprocess.run([_kubeadm(), "config", "validate", "--config", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr + r.stdout


def test_preflight_ignores_system_verification_only_on_cgroup_v1(caplog):
    from harness.kubeadm import preflight
    v1, v2 = preflight.args(True), preflight.args(False)
    assert v1 == ["--ignore-preflight-errors=Swap,FileContent--proc-sys-net-bridge-bridge-nf-call-iptables,"
                  "SystemVerification"]
    assert "SystemVerification" not in v2[0] and "all" not in v2[0].split("=")[1].split(",")
    preflight._warned.clear()
    with caplog.at_level("WARNING", logger="harness.kubeadm"):
        for _ in range(3):
            preflight.warn_cgroup_v1("kh")
    assert [r.getMessage()[:15] for r in caplog.records] == ["cgroup v1 host:"]


@pytest.mark.parametrize("family,node_ip,masks", [
    ("dual", "172.18.0.2,fd00:1::2", {"node-cidr-mask-size-ipv4": "24", "node-cidr-mask-size-ipv6": "64"}),
    ("ipv6", "fd00:1::2", {"node-cidr-mask-size": "64"}),
])
def test_ip_families(family, node_ip, masks):
    """Dual-stack and IPv6: a node-ip of each family (primary first, the advertise address),
    both networks in kubeadm's, kube-controller-manager's and kube-proxy's settings, and a
    podCIDR size per family (kube-controller-manager refuses the plain flag on dual-stack)."""
    s = spec(ipFamily=family, pods=None, services=None)
    ips = tuple(node_ip.split(","))
    node = kc.Node(CP.name, ips[0], True, {}, "", ips=ips)
    d = docs(s, node=node)
    init, cc = d["InitConfiguration"], d["ClusterConfiguration"]
    assert args(init["nodeRegistration"]["kubeletExtraArgs"])["node-ip"] == node_ip
    assert init["localAPIEndpoint"]["advertiseAddress"] == ips[0]
    assert cc["networking"]["podSubnet"] == s.pod_cidr and cc["networking"]["serviceSubnet"] == s.service_cidr
    cm = args(cc["controllerManager"]["extraArgs"])
    assert cm["cluster-cidr"] == s.pod_cidr
    assert {k: v for k, v in cm.items() if k.startswith("node-cidr-mask-size")} == masks
    assert d["KubeProxyConfiguration"]["clusterCIDR"] == s.pod_cidr
    join = kc.join_document(s, params(), kc.Node("w", ips[-1], ips=ips))
    assert args(join["nodeRegistration"]["kubeletExtraArgs"])["node-ip"] == node_ip
    assert kc.etcd_local_endpoint(s) == ("https://[::1]:2379" if family == "ipv6" else "https://127.0.0.1:2379")
