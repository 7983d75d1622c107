"""The provider author's path, taken by CAPD: a separate pytest session is given
only a management cluster's kubeconfig, a clusterctl config naming the provider
repositories, a flavor and the infrastructure provider's name, as a provider
author gives theirs, and runs a suite on the cluster it generates there."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import docker
import pytest
import yaml

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _inner_session(mgmt, tmp_path: Path, prefix: str, artifacts: Path, *args: str, timeout: float = 1800):
    """A separate pytest session on test_nodes.py, given ``mgmt`` the way a provider
    author gives theirs; returns (cluster name, exit code, output)."""
    name = f"{prefix}-{uuid.uuid4().hex[:4]}"
    spec = yaml.safe_load((ROOT / "configs" / "capi.yaml").read_text())
    spec["metadata"]["name"] = name
    spec_file = tmp_path / "cluster.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KUBE_HARNESS_CLUSTER_API"))}
    env["ARTIFACTS"] = str(artifacts)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--no-reap", "-q",
           str(ROOT / "suites" / "kubeadm" / "test_nodes.py"), "--cluster-config", str(spec_file),
           "--cluster-api", "--capi-management-kubeconfig", str(mgmt.kubeconfig),
           "--capi-clusterctl-config", str(mgmt.clusterctl.config), *args]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return name, p.returncode, p.stdout + p.stderr


def test_suite_runs_on_a_cluster_from_a_given_management_cluster(capi_management, tmp_path):
    mgmt = capi_management
    mgmt.prepare(yaml.safe_load((ROOT / "configs" / "capi.yaml").read_text())["spec"]["topology"]["version"])
    artifacts = Path(os.environ.get("ARTIFACTS", ROOT / "_artifacts")) / "provider-author-path"
    name, rc, out = _inner_session(mgmt, tmp_path, "kh-author", artifacts, "--capi-infrastructure", "docker",
                                   "--capi-flavor", "development", "--capi-container-nodes")
    assert rc == 0, out[-6000:]
    assert "6 passed" in out, out[-3000:]
    # the inner session made its cluster through this management cluster, and deleted it
    assert (artifacts / "junit_test_nodes.xml").is_file()
    dk = docker.from_env()
    try:
        assert dk.containers.list(all=True, filters={"label": f"io.x-k8s.kind.cluster={name}"}) == []
    finally:
        dk.close()


def test_template_with_unset_variables_fails_before_anything_is_made(capi_management, tmp_path):
    """A provider author's template whose variables are not all given: the session
    fails naming the option and the variables, and nothing reaches the management cluster."""
    mgmt = capi_management
    template = tmp_path / "cluster-template.yaml"
    template.write_text(yaml.safe_dump({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "${CLUSTER_NAME}", "namespace": "${NAMESPACE}"},
        "spec": {"clusterNetwork": {"pods": {"cidrBlocks": ["${POD_CIDR}"]}},
                 "controlPlaneRef": {"name": "${KH_UNSET_CONTROL_PLANE}"}}}))
    name, rc, out = _inner_session(mgmt, tmp_path, "kh-vars", tmp_path / "artifacts", "--capi-template",
                                   str(template), "--capi-var", "POD_CIDR=10.244.0.0/16", timeout=600)
    assert rc != 0, out[-3000:]
    assert (f"invalid --capi-template: '{template}'; allowed: a cluster template whose variables are all set; "
            f"not set: ['KH_UNSET_CONTROL_PLANE']") in out, out[-3000:]
    from kubernetes import client, config as kconfig
    api = kconfig.new_client_from_config(str(mgmt.kubeconfig))
    try:
        clusters = client.CustomObjectsApi(api).list_cluster_custom_object("cluster.x-k8s.io", "v1beta2", "clusters")
        assert [c["metadata"]["name"] for c in clusters["items"] if c["metadata"]["name"] == name] == []
    finally:
        api.close()
