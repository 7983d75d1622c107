"""Teardown really happens: on success, failure, Ctrl-C, SIGTERM and when an
xdist worker is killed (the reaper). Uses a real Docker engine."""
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

from providers.base import L_CLUSTER, L_KEEP, L_RUN

pytestmark = [pytest.mark.docker]
ROOT = Path(__file__).resolve().parent.parent
INNER = ROOT / "tests" / "inner" / "bare_machines.py"


@pytest.fixture
def dk():
    c = docker.from_env()
    yield c
    c.close()


def leftovers(dk, cluster: str) -> list[str]:
    f = {"label": f"{L_CLUSTER}={cluster}"}
    # sorted: Docker lists objects in no stable order
    return sorted([f"container:{c.name}" for c in dk.containers.list(all=True, filters=f)]
                  + [f"network:{n.name}" for n in dk.networks.list(filters=f)]
                  + [f"volume:{v.name}" for v in dk.volumes.list(filters=f)])


@pytest.fixture
def bare_config(write_spec):
    p, name = write_spec("t", workers=1)
    # the `machines` fixture names the cluster <name>-bare
    return p, f"{name}-bare"


def run_inner(tmp_path, cfg, mode, *extra, wait=True, env_extra=None):
    mark = tmp_path / "mark"
    env = {**os.environ, "INNER_MODE": mode, "INNER_MARK": str(mark), "ARTIFACTS": str(tmp_path / "art"),
           **(env_extra or {})}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_CURRENT_TEST", None)
    cmd = [sys.executable, "-m", "pytest", str(INNER), "-p", "no:cacheprovider", "-q",
           "--rootdir", str(ROOT), "-o", "python_files=*.py", "--cluster-config", str(cfg), *extra]
    # SIGINT as a terminal gives it, even when this runs as a background job (which ignores it)
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if not wait:
        return p, mark
    out, _ = p.communicate(timeout=600)
    return p.returncode, out, mark


def test_teardown_after_pass(dk, tmp_path, bare_config):
    cfg, cluster = bare_config
    rc, out, mark = run_inner(tmp_path, cfg, "pass")
    assert rc == 0, out
    assert len(mark.read_text().split()) == 2  # one control plane + one worker really existed
    assert leftovers(dk, cluster) == [], out


def test_teardown_after_failure_collects_artifacts(dk, tmp_path, bare_config):
    cfg, cluster = bare_config
    rc, out, mark = run_inner(tmp_path, cfg, "fail")
    assert rc == 1, out
    assert leftovers(dk, cluster) == [], out
    art = tmp_path / "art" / "clusters" / f"default-{cluster}"
    assert (art / "cluster.yaml").exists(), out
    machine_dirs = [d for d in art.iterdir() if d.is_dir()]
    assert len(machine_dirs) == 2, list(art.iterdir())
    assert any(f.stat().st_size > 0 for d in machine_dirs for f in d.iterdir()), "empty machine logs"
    junit = list((tmp_path / "art").glob("junit_*.xml"))
    assert junit, "no Prow-style junit_*.xml"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_teardown_on_interrupt(dk, tmp_path, bare_config, sig):
    cfg, cluster = bare_config
    p, mark = run_inner(tmp_path, cfg, "sleep", wait=False)
    end = time.monotonic() + 300
    while not mark.exists():
        assert p.poll() is None, p.stdout.read()
        assert time.monotonic() < end, "machines never came up"
        time.sleep(0.5)
    assert leftovers(dk, cluster), "machines should exist while the test runs"
    os.killpg(p.pid, sig)
    out, _ = p.communicate(timeout=180)
    assert p.returncode != 0
    assert leftovers(dk, cluster) == [], out


def test_keep_cluster_then_cli_down(dk, tmp_path, bare_config):
    cfg, cluster = bare_config
    rc, out, mark = run_inner(tmp_path, cfg, "pass", "--keep-cluster")
    assert rc == 0, out
    try:
        left = leftovers(dk, cluster)
        assert any(x.startswith("container:") for x in left), out
        kept = dk.containers.list(all=True, filters={"label": f"{L_CLUSTER}={cluster}"})
        assert all(c.labels[L_KEEP] == "true" for c in kept)
        # the reaper never takes kept clusters, even though their owner is gone
        r = subprocess.run([sys.executable, "-m", "harness", "reap"], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        assert leftovers(dk, cluster) == left
        # logs of a kept cluster can be exported later, as `kind export logs`
        r = subprocess.run([sys.executable, "-m", "harness", "logs", "-c", str(cfg), "--name", cluster,
                            "--dir", str(tmp_path / "logs")], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        exported = Path(r.stdout.strip())
        assert sorted(d.name for d in exported.iterdir() if d.is_dir()) == sorted(
            x.split(":", 1)[1] for x in left if x.startswith("container:")), r.stdout
        assert any(f.stat().st_size for d in exported.iterdir() if d.is_dir() for f in d.iterdir())
    finally:
        r = subprocess.run([sys.executable, "-m", "harness", "down", cluster], capture_output=True, text=True,
                           cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert leftovers(dk, cluster) == []


def test_killed_xdist_worker_is_reaped(dk, tmp_path, bare_config):
    """SIGKILL a worker: no finalizer runs there, the master's reaper cleans up."""
    cfg, cluster = bare_config
    cluster = f"{cluster}-gw0"
    rc, out, mark = run_inner(tmp_path, cfg, "kill", "-n", "1", "--cluster-scope", "worker")
    assert mark.exists(), out
    assert rc != 0, out  # the crashed test is reported
    assert leftovers(dk, cluster) == [], out
    assert "reaping run" in out, out  # the master's reaper did it, not a finalizer


def test_reaper_removes_objects_of_dead_process(dk, tmp_path):
    """A process that provisions and dies without cleanup leaves labelled
    objects; the reaper removes exactly those and not a live run's."""
    name = f"r{uuid.uuid4().hex[:6]}"
    code = f"""
import os
from harness.controller import MachineController
from harness.reaper import current_owner
from harness.spec import load
from providers import registry
spec = load({str(ROOT / 'configs' / 'single.yaml')!r}).with_overrides(name={name!r})
p = registry.get('docker')
MachineController(p, current_owner('dead-{name}')).provision(spec)
os._exit(0)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    assert leftovers(dk, name), "the dead process should have left machines"
    from harness import reaper
    from providers import registry
    deleted = reaper.reap(registry.get("docker"))
    assert any(name in d for d in deleted), deleted
    assert leftovers(dk, name) == []
    assert not dk.containers.list(all=True, filters={"label": f"{L_RUN}=dead-{name}"})


@pytest.mark.parametrize("scope", ["shared", "worker"])
def test_xdist_cluster_scope(dk, tmp_path, bare_config, scope):
    """-n 2: shared scope gives both workers the same machines, worker scope
    one cluster each; either way nothing is left after the run."""
    cfg, cluster = bare_config
    rc, out, mark = run_inner(tmp_path, cfg, "record", "-n", "2", "--cluster-scope", scope)
    assert rc == 0, out
    seen = {f.name: f.read_text().split() for f in mark.iterdir()}
    assert sorted(seen) == ["gw0", "gw1"], out
    assert all(len(names) == 2 for names in seen.values()), seen  # one control plane + one worker
    if scope == "shared":
        assert seen["gw0"] == seen["gw1"], seen
        assert all(n.startswith(f"{cluster}-") for n in seen["gw0"]), seen
    else:
        assert not set(seen["gw0"]) & set(seen["gw1"]), seen
        for w, names in seen.items():
            assert all(n.startswith(f"{cluster}-{w}-") for n in names), seen
    for suffix in ("", "-gw0", "-gw1"):
        assert leftovers(dk, cluster + suffix) == [], out
