"""--kubeconfig: the suites on a cluster the harness did not make in this
session (made here with ``kube-harness up``, as a user would bring theirs).
Nothing is created or deleted; tests that need what a given cluster cannot
give skip, saying why."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import docker
import pytest
import yaml

from providers.base import L_CLUSTER, L_RUN

pytestmark = [pytest.mark.docker, pytest.mark.cluster, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def given(tmp_path_factory):
    """A one-node cluster made outside the session under test; its kubeconfig."""
    name = f"kh-given-{uuid.uuid4().hex[:4]}"
    doc = yaml.safe_load((ROOT / "configs" / "single.yaml").read_text())
    doc["metadata"]["name"] = name
    spec = tmp_path_factory.mktemp("given") / "cluster.yaml"
    spec.write_text(yaml.safe_dump(doc))
    up = _cli("up", "-c", str(spec))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        kubeconfig = Path(re.search(r"KUBECONFIG=(\S+)", up.stdout + up.stderr).group(1))
        yield name, kubeconfig
    finally:
        down = _cli("down", name)
        assert down.returncode == 0, down.stdout + down.stderr


def containers(label: str) -> list[str]:
    dk = docker.from_env()
    try:
        return sorted(f"{c.name}:{c.id[:12]}" for c in dk.containers.list(all=True, filters={"label": label}))
    finally:
        dk.close()


def run_suites(tmp_path: Path, *args: str, given_name: str = "") -> tuple[int, str]:
    """An inner pytest session with ``args``; asserts it made no container and
    left the given cluster's containers as they were."""
    run_id = f"kg{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KUBE_HARNESS_CLUSTER_API"))}
    env.update(ARTIFACTS=str(tmp_path / "artifacts"), KUBE_HARNESS_RUN_ID=run_id)
    before = containers(f"{L_CLUSTER}={given_name}") if given_name else []
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "-q", *args], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=1200)
    assert containers(f"{L_RUN}={run_id}") == [], "the session created containers"
    if given_name:
        assert containers(f"{L_CLUSTER}={given_name}") == before, "the given cluster's containers changed"
    return p.returncode, p.stdout + p.stderr


def test_kubeconfig_and_state_are_private(given):
    """What `up` wrote (the admin kubeconfig, the bootstrap state with its token and
    certificate key) is readable by its owner only; and so is the given cluster's copy."""
    name, kubeconfig = given
    state = kubeconfig.parent
    assert state.stat().st_mode & 0o777 == 0o700
    files = [p for p in state.iterdir() if p.is_file()]
    assert kubeconfig in files and len(files) >= 2, files
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o600, (f, oct(f.stat().st_mode))
    from harness import reaper
    from harness.existing import existing_cluster
    copy = existing_cluster(kubeconfig, reaper.current_owner("test-given-copy")).state_dir
    assert copy.name.startswith(f"given-{name}-") and copy.stat().st_mode & 0o777 == 0o700
    assert (copy / "kubeconfig").stat().st_mode & 0o777 == 0o600


def test_kubeadm_suite_on_a_given_cluster(given, tmp_path):
    name, kubeconfig = given
    copies = set(Path(tempfile.gettempdir(), "kube-harness").glob(f"given-{name}-*"))
    rc, out = run_suites(tmp_path, "suites/kubeadm", "--kubeconfig", str(kubeconfig), given_name=name)
    assert rc == 0, out[-5000:]
    passed = int(re.search(r"(\d+) passed", out).group(1))
    assert passed >= 25, out[-3000:]
    # the harness's own settings are not checked on someone else's cluster
    assert "the cluster given by --kubeconfig was made by someone else" in out, out[-3000:]
    assert (tmp_path / "artifacts" / "junit_kubeadm.xml").is_file()
    # the session's copy of the given kubeconfig went with it
    assert set(Path(tempfile.gettempdir(), "kube-harness").glob(f"given-{name}-*")) == copies


def test_black_box_without_machine_access(given, tmp_path):
    """--machine-access=none: what needs a node's shell skips with the reason; the API checks run."""
    name, kubeconfig = given
    rc, out = run_suites(tmp_path, "suites/kubeadm/test_nodes.py", "suites/kubeadm/test_control_plane.py",
                         "--kubeconfig", str(kubeconfig), "--machine-access", "none", given_name=name)
    assert rc == 0, out[-5000:]
    assert "needs machine access: " in out and "machine access is off (--machine-access=none)" in out, out[-3000:]
    assert re.search(r"(\d+) passed", out), out[-3000:]


def test_lifecycle_makes_nothing_on_a_given_cluster(given, tmp_path):
    name, kubeconfig = given
    rc, out = run_suites(tmp_path, "suites/lifecycle/test_scale_repair.py", "--kubeconfig", str(kubeconfig),
                         given_name=name)
    assert rc == 0, out[-5000:]
    assert "makes clusters or machines of its own; with --kubeconfig the harness creates and deletes nothing" \
        in out, out[-3000:]
    assert " passed" not in out and " failed" not in out, out[-3000:]


@pytest.mark.parametrize("args,message", [
    (["--provider", "docker"], "invalid --provider: 'docker'; allowed: nothing with --kubeconfig"),
    (["--cluster-api"], "invalid --cluster-api: True; allowed: nothing with --kubeconfig"),
    (["--keep-cluster"], "invalid --keep-cluster: True; allowed: nothing with --kubeconfig"),
])
def test_making_options_refused_with_a_given_cluster(given, tmp_path, args, message):
    _, kubeconfig = given
    rc, out = run_suites(tmp_path, "suites/kubeadm/test_nodes.py", "--kubeconfig", str(kubeconfig), *args)
    assert rc == pytest.ExitCode.USAGE_ERROR, out
    assert message in out, out


def test_unreachable_kubeconfig_refused(tmp_path):
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}))
    rc, out = run_suites(tmp_path, "suites/kubeadm/test_nodes.py", "--kubeconfig", str(kc))
    assert rc == pytest.ExitCode.USAGE_ERROR, out
    assert f"invalid --kubeconfig: '{kc}'; allowed: the kubeconfig of a cluster that answers (" in out, out
    rc, out = run_suites(tmp_path, "suites/kubeadm/test_nodes.py", "--machine-access", "none")
    assert rc == pytest.ExitCode.USAGE_ERROR, out
    assert "invalid --machine-access: 'none'; allowed: only with --kubeconfig" in out, out


# --- kube-harness load-image ----------------------------------------------

def test_load_image_into_every_node(given, tmp_path):
    """A local image (the busybox the suites use, under a tag of its own) goes into every
    node; crictl lists it; a pod runs it with imagePullPolicy Never; a second load is a no-op."""
    from kubernetes import client, config as kconfig
    from harness.build.testimages import build_busybox
    name, kubeconfig = given
    tag = f"kube-harness/load-test:{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "tag", build_busybox(), tag], check=True)
    try:
        p = _cli("load-image", tag, "--cluster", name)
        assert p.returncode == 0, p.stdout + p.stderr
        assert re.search(rf"{name}-control-plane-\w+: loaded {re.escape(tag)}", p.stdout), p.stdout
        dk = docker.from_env()
        try:
            for c in dk.containers.list(filters={"label": f"{L_CLUSTER}={name}"}):
                if "control-plane" in c.name or "-md-" in c.name:
                    out = c.exec_run(["crictl", "images", "-o", "json"]).output.decode()
                    assert f"docker.io/{tag}" in out, (c.name, out[-2000:])
        finally:
            dk.close()
        again = _cli("load-image", tag, "--kubeconfig", str(kubeconfig))
        assert again.returncode == 0 and "had them" in again.stdout, again.stdout + again.stderr
        api = kconfig.new_client_from_config(str(kubeconfig))
        core = client.CoreV1Api(api)
        pod = f"load-test-{uuid.uuid4().hex[:6]}"
        core.create_namespaced_pod("default", client.V1Pod(
            metadata=client.V1ObjectMeta(name=pod),
            spec=client.V1PodSpec(restart_policy="Never", tolerations=[client.V1Toleration(operator="Exists")],
                                  containers=[client.V1Container(name="c", image=tag, image_pull_policy="Never",
                                                                 command=["sh", "-c", "echo loaded-ok"])])))
        try:
            end = time.monotonic() + 120
            while core.read_namespaced_pod(pod, "default").status.phase not in ("Succeeded", "Failed"):
                assert time.monotonic() < end, core.read_namespaced_pod(pod, "default").status
                time.sleep(2)
            assert core.read_namespaced_pod_log(pod, "default").strip() == "loaded-ok"
        finally:
            core.delete_namespaced_pod(pod, "default")
            api.close()
    finally:
        subprocess.run(["docker", "rmi", tag], capture_output=True)


def test_load_image_bad_inputs(given):
    name, _ = given
    p = _cli("load-image", "kube-harness/no-such-image:v0", "--cluster", name)
    assert (p.returncode, p.stderr.strip()) == (2, "error: invalid IMAGE: 'kube-harness/no-such-image:v0'; "
                                                   "allowed: an image in `docker images`"), p.stdout + p.stderr
    from harness.build.testimages import build_busybox
    p = _cli("load-image", build_busybox(), "--cluster", "kh-no-such-cluster")
    assert p.returncode == 2 and "invalid cluster: 'default/kh-no-such-cluster'; allowed: " in p.stderr, p.stderr
