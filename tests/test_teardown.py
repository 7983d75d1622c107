"""Teardown really happens: on success, failure, Ctrl-C, SIGTERM (also during
provisioning and during teardown, and twice), a Ctrl-C to an xdist run, when an
xdist worker or the session is killed (the reaper); a failed teardown or a
leftover fails the run; two sessions never share a cluster name by accident.
Uses a real Docker engine."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import docker
import pytest

from harness.cluster import Cluster
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


def _watch(p: subprocess.Popen) -> list[str]:
    """The child's output lines, collected as they come."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")), daemon=True).start()
    return lines


SIGNALS = {"ctrl-c": [signal.SIGINT], "sigterm": [signal.SIGTERM], "double-ctrl-c": [signal.SIGINT, signal.SIGINT]}


@pytest.mark.parametrize("when,how", [
    ("provisioning", "ctrl-c"), ("provisioning", "sigterm"),
    ("test", "ctrl-c"), ("test", "sigterm"), ("test", "double-ctrl-c"),
    ("teardown", "ctrl-c"), ("teardown", "double-ctrl-c"),
])
def test_interrupt_leaves_nothing(dk, tmp_path, bare_config, when, how):
    """Interrupted while machines are made, while the test runs or while they are deleted
    (where a second Ctrl-C must not cut teardown short): no container, network or volume,
    no kubeconfig or state directory and no run directory is left."""
    cfg, cluster = bare_config
    run = f"ti{uuid.uuid4().hex[:10]}"
    mode = "pass" if when == "teardown" else "sleep"
    p, mark = run_inner(tmp_path, cfg, mode, wait=False, env_extra={"KUBE_HARNESS_RUN_ID": run})
    lines = _watch(p)
    ready = {"provisioning": lambda: leftovers(dk, cluster),
             "test": mark.exists,
             "teardown": lambda: any("phase=teardown start" in line for line in lines)}[when]
    end = time.monotonic() + 300
    while not ready():
        assert p.poll() is None, "".join(lines)
        assert time.monotonic() < end, "".join(lines)
        time.sleep(0.1)
    for i, sig in enumerate(SIGNALS[how]):
        if i:
            time.sleep(0.3)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, sig)
    p.wait(timeout=300)
    out = "".join(lines)
    assert p.returncode != 0, out
    assert leftovers(dk, cluster) == [], out
    assert not Cluster.state_dir_of(cluster, "default").exists(), out
    assert not (Path(tempfile.gettempdir()) / "kube-harness" / "runs" / run).exists(), out
    if when == "teardown":
        assert "during teardown of default/" in out and "finishing it first, then stopping" in out, out


def test_sigkilled_session_is_reaped_by_the_cli(dk, tmp_path, bare_config):
    """SIGKILL: no finalizer runs; `kube-harness reap` removes what the dead run left."""
    cfg, cluster = bare_config
    p, mark = run_inner(tmp_path, cfg, "sleep", wait=False)
    end = time.monotonic() + 300
    while not mark.exists():
        assert p.poll() is None and time.monotonic() < end
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=60)
    assert leftovers(dk, cluster), "a killed session leaves its machines"
    r = subprocess.run([sys.executable, "-m", "harness", "reap"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert leftovers(dk, cluster) == [], r.stdout + r.stderr
    assert not Cluster.state_dir_of(cluster, "default").exists()


def test_ctrl_c_to_an_xdist_run(dk, tmp_path, bare_config):
    """-n 2, one cluster per worker, Ctrl-C to the whole process group while both sleep."""
    cfg, cluster = bare_config
    p, mark = run_inner(tmp_path, cfg, "sleep", "-n", "2", "--cluster-scope", "worker", wait=False,
                        env_extra={"INNER_SLEEPERS": "2"})
    lines = _watch(p)
    names = [f"{cluster}-gw0", f"{cluster}-gw1"]
    end = time.monotonic() + 300
    while not all(leftovers(dk, n) and any(f"cluster={n} phase=machines done" in x for x in lines) for n in names):
        assert p.poll() is None, "".join(lines)
        assert time.monotonic() < end, "".join(lines)
        time.sleep(0.2)
    time.sleep(1)
    os.killpg(p.pid, signal.SIGINT)
    p.wait(timeout=300)
    out = "".join(lines)
    assert p.returncode != 0, out
    for n in names:
        assert leftovers(dk, n) == [], out


def test_leftover_at_session_end_fails_the_run(dk, tmp_path, bare_config):
    """An object of the run that no teardown took: the run fails naming it, and it is deleted."""
    cfg, cluster = bare_config
    rc, out, mark = run_inner(tmp_path, cfg, "leak")
    assert rc == 1, out
    assert "kube-harness: cleanup failed" in out, out
    assert re.search(rf"leftovers of run \w+ at session end: volume/{cluster}-leaked", out), out
    assert "1 passed" in out, out
    assert leftovers(dk, cluster) == [] and leftovers(dk, f"{cluster}-leaked") == [], out


def test_failed_teardown_fails_the_run(dk, tmp_path, bare_config):
    """A machine's volume in use by a container the harness did not make: teardown cannot
    delete it, the run fails naming it (and the rest of the cluster is deleted)."""
    cfg, cluster = bare_config
    try:
        rc, out, mark = run_inner(tmp_path, cfg, "pin")
        assert rc == 1, out
        pinned = mark.read_text().split()[0]
        assert "teardown failed, objects are left" in out and f"{pinned}-var" in out, out
        assert leftovers(dk, cluster) == [f"volume:{pinned}-var"], out
    finally:
        for c in dk.containers.list(all=True, filters={"name": f"{cluster}-"}):
            if c.name.endswith("-pin"):
                c.remove(force=True, v=True)  # and the anonymous /var volume of the image
        subprocess.run([sys.executable, "-m", "harness", "down", cluster], capture_output=True, cwd=ROOT)
    assert leftovers(dk, cluster) == []


def test_two_sessions_with_one_cluster_name(dk, tmp_path, bare_config):
    """Started at once with the same cluster name: one makes the cluster, the other is
    refused naming the owner, and deletes nothing of it; the first cleans up as usual."""
    cfg, cluster = bare_config
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    procs = [run_inner(tmp_path / d, cfg, "sleep", wait=False) for d in ("a", "b")]
    end = time.monotonic() + 300
    while not any(mark.exists() for _, mark in procs):
        assert time.monotonic() < end, "no session made the machines"
        time.sleep(0.5)
    owner, other = procs if procs[0][1].exists() else procs[::-1]
    out, _ = other[0].communicate(timeout=300)
    assert other[0].returncode != 0, out
    assert re.search(rf"cluster default/{cluster} already exists, made by run \w+ \(pid \d+ on ", out), out
    assert owner[0].poll() is None, "the first session must still be running"
    names = owner[1].read_text().split()
    assert sorted(c.name for c in dk.containers.list(filters={"label": f"{L_CLUSTER}={cluster}"})) == sorted(names)
    os.killpg(owner[0].pid, signal.SIGINT)
    out, _ = owner[0].communicate(timeout=180)
    assert leftovers(dk, cluster) == [], out


ENGINE_PIDFILE = Path("/var/run/kube-harness-dockerd.pid")


def restart_engine() -> None:
    """Stop the Docker engine and start it again: ci/engine.sh's, or the system's."""
    pid = int(ENGINE_PIDFILE.read_text()) if ENGINE_PIDFILE.exists() else 0
    if pid and Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + 120
        while Path(f"/proc/{pid}").exists():
            assert time.monotonic() < end, "dockerd did not stop"
            time.sleep(0.2)
        r = subprocess.run(["bash", str(ROOT / "ci" / "engine.sh")], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    elif subprocess.run(["systemctl", "is-active", "--quiet", "docker"]).returncode == 0:
        subprocess.run(["systemctl", "restart", "docker"], check=True, timeout=300)
    else:
        pytest.fail("cannot restart this Docker engine (neither ci/engine.sh's nor systemd's docker)")


@pytest.mark.slow
def test_engine_restart_mid_test(tmp_path, bare_config):
    """The engine restarts while a test execs into a machine: the test fails saying
    so, and what the run could not delete is gone after `kube-harness reap`."""
    cfg, cluster = bare_config
    p, mark = run_inner(tmp_path, cfg, "engine", wait=False)
    lines = _watch(p)
    end = time.monotonic() + 300
    while not mark.exists():
        assert p.poll() is None and time.monotonic() < end, "".join(lines)
        time.sleep(0.2)
    restart_engine()
    p.wait(timeout=600)
    out = "".join(lines)
    assert p.returncode != 0, out
    assert re.search(r"exec true: the Docker engine does not answer .*; was it stopped or restarted\?"
                     r"|the Docker engine restarted at", out), out
    r = subprocess.run([sys.executable, "-m", "harness", "reap"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    dk = docker.from_env()
    try:
        assert leftovers(dk, cluster) == [], out + r.stdout + r.stderr
    finally:
        dk.close()


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


def test_nested_deferred_blocks_hold_interrupts_until_the_outermost_ends():
    """A Ctrl-C inside nested blocks (a cluster's teardown inside the session's end) is held
    until the outermost block has done all its work, then raised once."""
    from harness import interrupts
    done = []
    with pytest.raises(KeyboardInterrupt, match=r"SIGINT \(held during the outer\)"):
        with interrupts.deferred("the outer"):
            with interrupts.deferred("the inner"):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
                done.append("inner")
            done.append("outer")
    assert done == ["inner", "outer"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
