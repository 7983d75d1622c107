"""Bootstrap tokens, cluster-info and the TLS bootstrap RBAC (kubernetes
test/e2e_kubeadm: bootstrap_token_test.go, cluster_info_test.go,
nodes_test.go, bootstrap_signer.go)."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
import yaml
from kubernetes import client


pytestmark = [pytest.mark.cluster]

BOOTSTRAP_GROUP = "system:bootstrappers:kubeadm:default-node-token"
JWS_PREFIX = "jws-kubeconfig-"


def _b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def _b64url_decode(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def bootstrap_tokens(cluster) -> dict[str, dict[str, str]]:
    out = {}
    for s in cluster.core.list_namespaced_secret("kube-system").items:
        if s.type == "bootstrap.kubernetes.io/token":
            data = {k: base64.b64decode(v).decode() for k, v in (s.data or {}).items()}
            out[data["token-id"]] = data
    return out


def test_bootstrap_token_exists(cluster):
    tokens = bootstrap_tokens(cluster)
    assert tokens, "no bootstrap token Secret in kube-system"
    for tid, t in tokens.items():
        assert len(t["token-secret"]) == 16, tid
    # the join token (the others are e.g. kubeadm's proxy token for the uploaded certs)
    join = [t for t in tokens.values() if t.get("usage-bootstrap-authentication") == "true"]
    assert join, f"no token usable for joining: {sorted(tokens)}"
    for t in join:
        assert t.get("usage-bootstrap-signing") == "true", t["token-id"]
        assert BOOTSTRAP_GROUP in t.get("auth-extra-groups", "").split(","), t["token-id"]


def test_cluster_info_signed_by_token(cluster):
    cm = cluster.core.read_namespaced_config_map("cluster-info", "kube-public")
    kubeconfig = cm.data["kubeconfig"]
    kc = yaml.safe_load(kubeconfig)
    server = kc["clusters"][0]["cluster"]["server"]
    ep = yaml.safe_load(cluster.core.read_namespaced_config_map("kubeadm-config", "kube-system")
                        .data["ClusterConfiguration"])["controlPlaneEndpoint"]
    assert server == f"https://{ep}"
    assert kc["clusters"][0]["cluster"]["certificate-authority-data"]
    sigs = {k[len(JWS_PREFIX):]: v for k, v in cm.data.items() if k.startswith(JWS_PREFIX)}
    tokens = bootstrap_tokens(cluster)
    signing = {tid for tid, t in tokens.items() if t.get("usage-bootstrap-signing") == "true"}
    assert signing, "no signing bootstrap token"
    assert signing <= set(sigs), f"tokens {signing - set(sigs)} have no {JWS_PREFIX}<id> signature"
    for tid in signing:
        # detached JWS: <header>..<signature>, HS256 keyed with the token secret
        header, payload, sig = sigs[tid].split(".")
        assert payload == ""
        hdr = json.loads(_b64url_decode(header))
        assert hdr["alg"] == "HS256" and hdr.get("kid") == tid
        signing_input = f"{header}.{_b64url(kubeconfig.encode())}".encode()
        want = hmac.new(tokens[tid]["token-secret"].encode(), signing_input, hashlib.sha256).digest()
        assert hmac.compare_digest(_b64url(want), sig), f"{JWS_PREFIX}{tid} does not verify"


def test_cluster_info_rbac_and_anonymous_access(cluster, subject_access):
    rbac = client.RbacAuthorizationV1Api(cluster.api_client())
    rbac.read_namespaced_role("kubeadm:bootstrap-signer-clusterinfo", "kube-public")
    rb = rbac.read_namespaced_role_binding("kubeadm:bootstrap-signer-clusterinfo", "kube-public")
    assert any(s.name == "system:anonymous" for s in rb.subjects)
    assert subject_access(user="system:anonymous", namespace="kube-public", resource="configmaps",
                          name="cluster-info")


@pytest.mark.parametrize("binding,kind,subject,role", [
    ("kubeadm:kubelet-bootstrap", "Group", BOOTSTRAP_GROUP, "system:node-bootstrapper"),
    ("kubeadm:node-autoapprove-bootstrap", "Group", BOOTSTRAP_GROUP,
     "system:certificates.k8s.io:certificatesigningrequests:nodeclient"),
    ("kubeadm:node-autoapprove-certificate-rotation", "Group", "system:nodes",
     "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient"),
    ("kubeadm:get-nodes", "Group", BOOTSTRAP_GROUP, "kubeadm:get-nodes"),
])
def test_bootstrap_rbac(cluster, binding, kind, subject, role):
    rbac = client.RbacAuthorizationV1Api(cluster.api_client())
    crb = rbac.read_cluster_role_binding(binding)
    assert crb.role_ref.kind == "ClusterRole" and crb.role_ref.name == role
    assert any(s.kind == kind and s.name == subject for s in crb.subjects), crb.subjects
    rbac.read_cluster_role(role)


def test_bootstrap_token_may_post_csr(cluster, subject_access):
    assert subject_access(user="system:bootstrap:abcdef", groups=[BOOTSTRAP_GROUP],
                          namespace="", resource="certificatesigningrequests", name="", verb="create",
                          group="certificates.k8s.io")
