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


def test_suite_runs_on_a_cluster_from_a_given_management_cluster(capi_management, tmp_path):
    mgmt = capi_management
    name = f"kh-author-{uuid.uuid4().hex[:4]}"
    spec = yaml.safe_load((ROOT / "configs" / "capi.yaml").read_text())
    spec["metadata"]["name"] = name
    spec_file = tmp_path / "cluster.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    mgmt.prepare(spec["spec"]["topology"]["version"])  # the node image where the provider looks for it
    artifacts = Path(os.environ.get("ARTIFACTS", ROOT / "_artifacts")) / "provider-author-path"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KUBE_HARNESS_CLUSTER_API"))}
    env["ARTIFACTS"] = str(artifacts)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--no-reap", "-q",
           str(ROOT / "suites" / "kubeadm" / "test_nodes.py"), "--cluster-config", str(spec_file),
           "--cluster-api", "--capi-management-kubeconfig", str(mgmt.kubeconfig),
           "--capi-clusterctl-config", str(mgmt.clusterctl.config), "--capi-infrastructure", "docker",
           "--capi-flavor", "development", "--capi-container-nodes"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    assert "6 passed" in out, out[-3000:]
    # the inner session made its cluster through this management cluster, and deleted it
    assert (artifacts / "junit_test_nodes.xml").is_file()
    dk = docker.from_env()
    try:
        assert dk.containers.list(all=True, filters={"label": f"io.x-k8s.kind.cluster={name}"}) == []
    finally:
        dk.close()
