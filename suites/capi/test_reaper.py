"""A session killed while Cluster API is still making its workload cluster
leaves nothing behind: the next session's reaper deletes the dead run's
workload clusters through its management cluster's controllers (CAPD removes
the containers it made, even half-provisioned ones), then the management
cluster."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import docker
import pytest
import yaml

from harness import reaper
from providers.base import L_RUN
from providers.docker import DockerProvider

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
INNER = '''
import os, pathlib, time
def test_hold(cluster):
    pathlib.Path(os.environ["INNER_MARK"]).write_text(cluster.name)
    time.sleep(3600)
'''


def test_session_killed_while_provisioning_leaves_no_capd_containers(tmp_path):
    name = f"kh-kill-{uuid.uuid4().hex[:4]}"
    spec = yaml.safe_load((ROOT / "configs" / "capi.yaml").read_text())
    spec["metadata"]["name"] = name
    del spec["spec"]["topology"]["workers"]  # a control plane only
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "test_hold.py").write_text(INNER)
    mark, run_id = tmp_path / "mark", f"kill{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(INNER_MARK=str(mark), KUBE_HARNESS_RUN_ID=run_id, ARTIFACTS=str(tmp_path / "art"))
    p = subprocess.Popen([sys.executable, "-m", "pytest", str(tmp_path / "test_hold.py"), "-p", "no:cacheprovider",
                          "-q", "--rootdir", str(tmp_path), "--cluster-api", "--cluster-config",
                          str(tmp_path / "cluster.yaml")], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    dk = docker.from_env()
    capd = {"label": f"io.x-k8s.kind.cluster={name}"}
    try:
        end = time.monotonic() + 1500
        # the first container CAPD makes for the workload: provisioning has begun
        while not dk.containers.list(all=True, filters=capd) and p.poll() is None and time.monotonic() < end:
            time.sleep(1)
        assert dk.containers.list(all=True, filters=capd), (p.poll(), p.stdout.read() if p.poll() is not None else "")
        assert not mark.exists(), "killed too late: the workload was already up"
        p.send_signal(signal.SIGKILL)  # no teardown runs
        p.wait(30)
        time.sleep(5)  # the controllers go on making machines meanwhile
        assert dk.containers.list(all=True, filters=capd)  # still there
        deleted = reaper.reap(DockerProvider())
        assert any(name in d for d in deleted), deleted  # the management cluster <name>-mgmt
        assert dk.containers.list(all=True, filters=capd) == []
        assert dk.containers.list(all=True, filters={"label": f"{L_RUN}={run_id}"}) == []
    finally:
        if p.poll() is None:
            p.kill()
        reaper.reap(DockerProvider())
        dk.close()
