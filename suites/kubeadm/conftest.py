"""Options and fixtures of the kubeadm suite. The ``cluster`` fixture (a
bootstrapped ``harness.cluster.Cluster``) comes from the harness pytest plugin.

    python -m pytest suites/kubeadm                               # kubeadm's e2e suite + the harness's checks
    python -m pytest suites/kubeadm --e2e-kubeadm-focus 'networking'   # a part of kubeadm's e2e suite
"""
from __future__ import annotations

import os
import time
import uuid

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("kubeadm", "kubeadm's own e2e suite (e2e_kubeadm.test)")
    g.addoption("--e2e-kubeadm-focus", default=None,
                help=r"ginkgo focus regex for e2e_kubeadm.test (default \[area-kubeadm\]: every spec)")
    g.addoption("--e2e-kubeadm-skip", default=None, help="ginkgo skip regex for e2e_kubeadm.test")
    g.addoption("--e2e-kubeadm-binary", default=os.environ.get("KUBE_HARNESS_E2E_KUBEADM_BINARY"),
                help="use this e2e_kubeadm.test instead of building it")


@pytest.fixture(scope="session")
def cluster_configuration(cluster) -> dict:
    """ClusterConfiguration from the kubeadm-config ConfigMap."""
    cm = cluster.core.read_namespaced_config_map("kubeadm-config", "kube-system")
    return yaml.safe_load(cm.data["ClusterConfiguration"])


@pytest.fixture(scope="session")
def nodes(cluster) -> list:
    return cluster.core.list_node().items


@pytest.fixture(scope="session")
def busybox(cluster) -> str:
    """The harness busybox image, present on every node."""
    from harness.build.testimages import build_busybox, ensure_loaded
    tag = build_busybox()
    ensure_loaded(cluster, [tag])
    return tag


@pytest.fixture(scope="module")
def namespace(cluster):
    """A namespace for the module's objects, deleted afterwards."""
    name = f"kh-kubeadm-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=name, labels={"harness.k8s.io/suite": "kubeadm"})))
    yield name
    try:
        cluster.core.delete_namespace(name, propagation_policy="Foreground")
    except ApiException as e:
        if e.status != 404:
            raise
    end = time.monotonic() + 120
    while time.monotonic() < end:
        try:
            cluster.core.read_namespace(name)
        except ApiException as e:
            if e.status == 404:
                return
        time.sleep(2)
