"""Fixtures of the kubeadm suite. The ``cluster`` fixture (a bootstrapped
``harness.cluster.Cluster``) comes from the harness pytest plugin."""
from __future__ import annotations

import time
import uuid

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"


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


@pytest.fixture(scope="session")
def subject_access(cluster):
    """``subject_access(user=, groups=, namespace=, resource=, name=, verb=, group=) -> bool``."""
    return lambda **kw: _subject_access(cluster, **kw)


def _subject_access(cluster, *, user: str | None = None, groups: list[str] | None = None, namespace: str,
                   resource: str, name: str, verb: str = "get", group: str = "") -> bool:
    """SubjectAccessReview (as the kubeadm e2e ExpectSubjectHasAccessToResource)."""
    sar = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=user, groups=groups,
        resource_attributes=client.V1ResourceAttributes(namespace=namespace or None, resource=resource,
                                                        name=name or None, verb=verb, group=group or None)))
    return client.AuthorizationV1Api(cluster.api_client()).create_subject_access_review(sar).status.allowed
