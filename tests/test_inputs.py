"""Bad inputs (pytest options, CLI arguments, scale requests) fail early with
the option, the value and what is allowed, and create nothing in Docker.
Uses a real Docker engine for reads only."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import docker
import pytest
import yaml

from harness import reaper
from harness.cluster import Cluster
from harness.controller import MachineController
from harness.spec import load
from providers.base import L_CLUSTER, L_RUN
from providers.docker import DockerProvider

pytestmark = [pytest.mark.docker]
ROOT = Path(__file__).resolve().parent.parent
MISSING_IMAGE = "kube-harness/no-such-node:v0"
TINY = "def test_needs_cluster(cluster):\n    raise AssertionError('must not run')\n"


@pytest.fixture(scope="module")
def dk():
    c = docker.from_env()
    yield c
    c.close()


def objects(dk, label: str) -> list[str]:
    """Names of containers, networks and volumes carrying ``label`` (key=value)."""
    f = {"label": label}
    return sorted([f"container:{c.name}" for c in dk.containers.list(all=True, filters=f)]
                  + [f"network:{n.name}" for n in dk.networks.list(filters=f)]
                  + [f"volume:{v.name}" for v in dk.volumes.list(filters=f)])


@pytest.fixture
def spec_file(tmp_path, dk):
    """A valid spec with a cluster name of its own; asserts Docker holds none
    of its objects before and after the test."""
    name = f"ti-{uuid.uuid4().hex[:8]}"
    doc = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    doc["metadata"]["name"] = name
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    names = (name, f"{name}-bare")
    assert [o for n in names for o in objects(dk, f"{L_CLUSTER}={n}")] == []
    yield path, name
    assert [o for n in names for o in objects(dk, f"{L_CLUSTER}={n}")] == []


def run_pytest(tmp_path, dk, *args: str) -> tuple[int, str]:
    """The real pytest with the plugin on a test that needs the ``cluster``
    fixture; asserts the run labelled nothing in Docker."""
    test = tmp_path / "test_tiny.py"
    test.write_text(TINY)
    run_id = f"ti{uuid.uuid4().hex[:10]}"
    env = {**os.environ, "KUBE_HARNESS_RUN_ID": run_id}
    for k in ("PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST", "KUBE_HARNESS_CONFIG", "PYTEST_ADDOPTS"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-m", "pytest", str(test), "-p", "no:cacheprovider", "-q",
                        "--rootdir", str(tmp_path), "--no-reap", *args],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert objects(dk, f"{L_RUN}={run_id}") == []
    return p.returncode, p.stdout + p.stderr


def run_cli(*args: str) -> tuple[int, str]:
    p = subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout + p.stderr


# --- pytest options -----------------------------------------------------

@pytest.mark.parametrize("option,value,allowed", [
    ("--provider", "nope", "one of ['docker']"),
    ("--kubernetes-version", "v1.99.0", "a supported release: v1.35.x, v1.36.x, v1.37.x"),
    ("--kubernetes-version", "1.37", "(vMAJOR.MINOR.PATCH)"),
    ("--node-image", MISSING_IMAGE, "an image in `docker images`"),
])
def test_bad_option_fails_session(tmp_path, dk, spec_file, option, value, allowed):
    rc, out = run_pytest(tmp_path, dk, "--cluster-config", str(spec_file[0]), option, value)
    assert rc == pytest.ExitCode.USAGE_ERROR, out
    assert f"ERROR: invalid {option}: {value!r}; allowed: " in out and allowed in out, out
    assert "must not run" not in out and "test_needs_cluster" not in out, out


@pytest.mark.parametrize("args,option,value,allowed", [
    (["--capi-flavor", "dev"], "--capi-flavor", "dev", "only with --cluster-api"),
    (["--cluster-api"], "spec.topology.version", "v1.37.2",
     "a Kubernetes version from v1.32 to v1.36: the Cluster API release the harness builds supports"),
    (["--cluster-api", "--kubernetes-version", "v1.36.3", "--capi-var", "NO VALUE"], "--capi-var", "NO VALUE",
     "NAME=VALUE"),
    (["--cluster-api", "--kubernetes-version", "v1.36.3", "--capi-template", "t.yaml"], "--capi-template",
     "t.yaml", "only with --capi-management-kubeconfig"),
    (["--cluster-api", "--kubernetes-version", "v1.36.3", "--capi-management-kubeconfig", "/nonexistent/kc"],
     "--capi-management-kubeconfig", "/nonexistent/kc", "an existing kubeconfig file"),
    (["--cluster-api", "--kubernetes-version", "v1.36.3", "--capi-management-kubeconfig", str(ROOT / "README.md")],
     "--capi-management-kubeconfig", str(ROOT / "README.md"), "a readable kubeconfig ("),
])
def test_bad_cluster_api_option_fails_session(tmp_path, dk, spec_file, args, option, value, allowed):
    """Checked before any cluster (management or workload) is made."""
    rc, out = run_pytest(tmp_path, dk, "--cluster-config", str(spec_file[0]), *args)
    assert rc == pytest.ExitCode.USAGE_ERROR, out
    assert f"invalid {option}: {value!r}; allowed: " in out and allowed in out, out
    assert "must not run" not in out, out


def test_cluster_api_mode_refuses_kubeadm_patches(tmp_path, dk, spec_file):
    path, _ = spec_file
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["topology"]["version"] = "v1.36.3"
    doc["spec"]["kubeadm"] = {"clusterConfiguration": {"apiServer": {"extraArgs": [{"name": "v", "value": "2"}]}}}
    path.write_text(yaml.safe_dump(doc))
    rc, out = run_pytest(tmp_path, dk, "--cluster-config", str(path), "--cluster-api")
    assert rc == pytest.ExitCode.USAGE_ERROR, out
    assert "invalid spec.kubeadm: ['clusterConfiguration']; allowed: nothing in Cluster API mode" in out, out


def test_missing_cluster_config(tmp_path, dk):
    missing = tmp_path / "nope.yaml"
    rc, out = run_pytest(tmp_path, dk, "--cluster-config", str(missing))
    assert rc == pytest.ExitCode.USAGE_ERROR, out
    assert f"ERROR: invalid --cluster-config: '{missing}'; allowed: a path to an existing YAML file" in out, out


def test_bad_spec_fails_session(tmp_path, dk, spec_file):
    path, name = spec_file
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["topology"]["controlPlane"]["replicas"] = 2
    path.write_text(yaml.safe_dump(doc))
    rc, out = run_pytest(tmp_path, dk, "--cluster-config", str(path))
    assert rc == pytest.ExitCode.USAGE_ERROR, out
    assert f"{path}: invalid spec.topology.controlPlane.replicas: 2; allowed: an odd number" in out, out


def test_bad_cluster_scope(tmp_path, dk, spec_file):
    rc, out = run_pytest(tmp_path, dk, "--cluster-config", str(spec_file[0]), "--cluster-scope", "bogus")
    assert rc == pytest.ExitCode.USAGE_ERROR, out
    assert "argument --cluster-scope: invalid choice: 'bogus' (choose from 'shared', 'worker')" in out, out


def test_bad_option_with_xdist_starts_no_worker(tmp_path, dk, spec_file):
    rc, out = run_pytest(tmp_path, dk, "--cluster-config", str(spec_file[0]), "-n", "2", "--provider", "nope")
    assert rc == pytest.ExitCode.USAGE_ERROR, out
    assert out.count("invalid --provider: 'nope'") == 1, out  # the controller checks once
    assert "[gw0]" not in out and "workers" not in out, out


# --- kubeadm patches, checked by the real kubeadm ---------------------------

BAD_PATCHES = {
    "clusterConfiguration": {"networking": {"podSubnett": "10.250.0.0/16"}},
    "kubeletConfiguration": {"failSwapOnn": False, "maxPods": "many"},
    "kubeProxyConfiguration": {"conntrack": {"maxPerCor": 1}},
    "joinConfiguration": {"discovery": {"timeoutt": "5m"}},
}
BAD_PATCH_LINES = [
    "invalid spec.kubeadm.clusterConfiguration.networking.podSubnett: '10.250.0.0/16'; allowed: a field of "
    "kubeadm's ClusterConfiguration (did you mean 'podSubnet'?)",
    "invalid spec.kubeadm.kubeletConfiguration.maxPods: 'many'; allowed: a value of Go type int32",
    "invalid spec.kubeadm.kubeProxyConfiguration.conntrack.maxPerCor: 1; allowed: a field of kubeadm's "
    "KubeProxyConfiguration (did you mean 'maxPerCore'?)",
    "invalid spec.kubeadm.joinConfiguration.discovery.timeoutt: '5m'; allowed: a field of kubeadm's "
    "JoinConfiguration",
]


@pytest.fixture(scope="module")
def kubeadm_built():
    """The default version's kubeadm on this host (cached by ci/setup.sh; built otherwise)."""
    from harness.build.kube import build_kubernetes
    return build_kubernetes() / "bin" / "kubeadm"


def _with_patches(path: Path, patches: dict) -> Path:
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["kubeadm"] = patches
    path.write_text(yaml.safe_dump(doc))
    return path


def test_bad_kubeadm_patches_fail_session(tmp_path, dk, spec_file, kubeadm_built):
    """Every unknown field, wrong type and value kubeadm refuses, in every document, at once."""
    path = _with_patches(spec_file[0], BAD_PATCHES)
    rc, out = run_pytest(tmp_path, dk, "--cluster-config", str(path))
    assert rc == pytest.ExitCode.USAGE_ERROR, out
    for line in BAD_PATCH_LINES:
        assert f"{path}: {line}" in out, out
    assert "must not run" not in out, out


def test_bad_kubeadm_patches_in_cli(spec_file, kubeadm_built):
    path = _with_patches(spec_file[0], {"kubeletConfiguration": {"failSwapOnn": False}})
    for cmd in ("validate", "up"):
        rc, out = run_cli(cmd, "-c", str(path))
        assert rc == 2, out
        assert out.strip() == (f"error: {path}: invalid spec.kubeadm.kubeletConfiguration.failSwapOnn: False; "
                               f"allowed: a field of kubeadm's KubeletConfiguration (did you mean 'failSwapOn'?)")
    # kubeadm's own validation (once the fields decode)
    path = _with_patches(path, {"clusterConfiguration": {"certificatesDir": "relative", "etcd": {"local": {
        "dataDir": "/var/lib/etcd", "extraArgs": [{"name": "quota-backend-bytes", "value": "8589934592"}]}}}})
    rc, out = run_cli("validate", "-c", str(path))
    assert rc == 2, out
    assert out.strip() == (f"error: {path}: invalid spec.kubeadm.clusterConfiguration.certificatesDir: 'relative'; "
                           f"allowed: a value kubeadm's ClusterConfiguration accepts; kubeadm: path is not absolute")


def test_good_kubeadm_patches_pass(spec_file, kubeadm_built):
    path = _with_patches(spec_file[0], {
        "clusterConfiguration": {"apiServer": {"extraArgs": [{"name": "v", "value": "2"}]}},
        "kubeletConfiguration": {"maxPods": 50, "evictionHard": {"memory.available": "1%"}},
        "kubeProxyConfiguration": {"iptables": {"minSyncPeriod": "2s"}},
        "joinConfiguration": {"nodeRegistration": {"ignorePreflightErrors": ["Swap"]}},
    })
    rc, out = run_cli("validate", "-c", str(path))
    assert rc == 0 and out.startswith("ok: "), out


# --- CLI ----------------------------------------------------------------

def clusters(dk) -> set[str]:
    return {f"{c.labels.get('harness.k8s.io/namespace')}/{c.labels[L_CLUSTER]}"
            for c in dk.containers.list(all=True, filters={"label": L_CLUSTER})}


def test_down_of_missing_cluster(dk):
    name = f"ti-{uuid.uuid4().hex[:8]}"
    before = clusters(dk)
    rc, out = run_cli("down", name)
    assert rc == 2, out
    assert f"error: invalid cluster: 'default/{name}'; allowed: " in out, out
    for c in before & clusters(dk):  # the existing ones are listed
        assert repr(c) in out, out
    assert objects(dk, f"{L_CLUSTER}={name}") == []


def test_logs_of_missing_cluster(spec_file, tmp_path):
    path, name = spec_file
    rc, out = run_cli("logs", "-c", str(path), "--dir", str(tmp_path / "art"))
    assert rc == 2, out
    assert f"error: invalid cluster: 'default/{name}'; allowed: " in out, out
    assert not (tmp_path / "art").exists()


def test_up_of_missing_and_bad_spec(tmp_path):
    rc, out = run_cli("up", "-c", str(tmp_path / "nope.yaml"))
    assert (rc, out.strip()) == (2, f"error: invalid --cluster-config: '{tmp_path / 'nope.yaml'}'; "
                                    f"allowed: a path to an existing YAML file (see configs/)")
    bad = tmp_path / "bad.yaml"
    doc = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    doc["metadata"]["name"] = "Bad_Name"
    doc["spec"]["topology"]["version"] = "v1.99.0"
    bad.write_text(yaml.safe_dump(doc))
    rc, out = run_cli("up", "-c", str(bad))
    assert rc == 2, out
    assert out.startswith(f"error: {bad}: invalid metadata.name: 'Bad_Name'; allowed: "), out
    assert f"error: {bad}: invalid spec.topology.version: 'v1.99.0'; allowed: " in out, out


def test_up_with_missing_node_image(spec_file):
    rc, out = run_cli("up", "-c", str(spec_file[0]), "--node-image", MISSING_IMAGE)
    assert rc == 2, out
    assert f"error: invalid --node-image: {MISSING_IMAGE!r}; allowed: an image in `docker images`" in out, out


# --- scale --------------------------------------------------------------

@pytest.fixture
def handle(spec_file, tmp_path):
    """A Cluster handle and controller on the real Docker provider; no machines exist."""
    spec = load(spec_file[0])
    provider = DockerProvider(spec.provider_options)
    owner = reaper.current_owner(f"ti{uuid.uuid4().hex[:10]}")
    yield Cluster(spec, provider, owner, state_dir=tmp_path / "state"), MachineController(provider, owner)
    provider.close()


@pytest.mark.parametrize("role,replicas,allowed", [
    ("worker", -1, "an integer from 0 to 9"),
    ("worker", 10, "an integer from 0 to 9"),
    ("worker", 10**6, "an integer from 0 to 9"),
    ("worker", 2.0, "an integer from 0 to 9"),
    ("worker", "2", "an integer from 0 to 9"),
    ("worker", True, "an integer from 0 to 9"),
    ("worker", None, "an integer from 0 to 9"),
    ("control-plane", 0, "an odd number (etcd quorum) from 1 to 8"),
    ("control-plane", 2, "an odd number (etcd quorum) from 1 to 8"),
    ("control-plane", 9, "an odd number (etcd quorum) from 1 to 8"),
])
def test_scale_rejects_bad_replicas(handle, role, replicas, allowed):
    cluster, ctl = handle
    md = next(d for d in cluster.deployments.values() if d.role == role)
    was = md.replicas
    with pytest.raises(ValueError) as e:
        ctl.scale(cluster, md.name, replicas)
    assert str(e.value) == (f"invalid replicas for {md.name}: {replicas!r}; "
                            f"allowed: {allowed} (at most 10 machines in all)")
    assert md.replicas == was


def test_replicas_within_limits_pass(handle):
    cluster, _ = handle
    cp, md = cluster.deployments.values()
    for n in (0, 1, 9):
        cluster.check_replicas(md.name, n)
    for n in (1, 3, 5, 7):
        cluster.check_replicas(cp.name, n)
