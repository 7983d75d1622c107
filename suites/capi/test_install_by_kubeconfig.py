"""``kube-harness capi-init --kubeconfig``: the providers the harness builds go into
a cluster known only by its kubeconfig (its nodes reached through their
providerIDs for the images), as ``clusterctl init`` would put them."""
from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from kubernetes import client

from harness.capi.repository import CLUSTERCTL_NAMES
from harness.plugin import ClusterFactory
from harness.spec import load

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def plain_cluster(request):
    """A cluster with nothing of Cluster API in it (made directly, deleted after)."""
    f = ClusterFactory(request.config, request, direct=True)
    try:
        yield f(load(ROOT / "configs" / "capi-management.yaml"), name=f"kh-init-{uuid.uuid4().hex[:4]}")
    finally:
        f.finish(failed=False)


def test_capi_init_by_kubeconfig(plain_cluster):
    p = subprocess.run([sys.executable, "-m", "harness", "capi-init", "--kubeconfig",
                        str(plain_cluster.kubeconfig_path)], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert "Cluster API providers installed" in p.stdout
    api = plain_cluster.api_client()
    items = client.CustomObjectsApi(api).list_cluster_custom_object(
        "clusterctl.cluster.x-k8s.io", "v1alpha3", "providers")["items"]
    assert sorted((i["type"], i["providerName"]) for i in items) == \
        sorted((kind, name) for name, kind, _ in CLUSTERCTL_NAMES.values())
    apps = client.AppsV1Api(api)
    for ns in ("capi-system", "capi-kubeadm-bootstrap-system", "capi-kubeadm-control-plane-system", "capd-system"):
        deps = apps.list_namespaced_deployment(ns).items
        assert deps and all(d.status.available_replicas == d.spec.replicas for d in deps), ns


def test_capi_init_refuses_a_missing_kubeconfig(tmp_path):
    p = subprocess.run([sys.executable, "-m", "harness", "capi-init", "--kubeconfig", str(tmp_path / "nope")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert f"invalid --kubeconfig: '{tmp_path / 'nope'}'; allowed: an existing kubeconfig file" in p.stderr
