"""Run by tests/test_teardown.py in a child pytest: uses the `machines` fixture,
then behaves as INNER_MODE says (pass, fail, sleep for Ctrl-C, kill the worker,
record which machines each xdist worker got, leak a labelled object, pin a
machine's volume with a container of its own so that teardown fails, exec
into a machine until the Docker engine goes away)."""
import os
import signal
import time
from pathlib import Path

import pytest


@pytest.mark.parametrize("i", range(2) if os.environ.get("INNER_MODE") == "record"
                         else range(int(os.environ.get("INNER_SLEEPERS", "1"))))
def test_inner(machines, i):
    ms = machines.machines()
    assert ms, "no machines"
    mode = os.environ.get("INNER_MODE", "pass")
    mark = Path(os.environ["INNER_MARK"])
    if mode == "record":
        mark.mkdir(exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "master")
        (mark / worker).write_text(" ".join(sorted(m.name for m in ms)))
        time.sleep(3)  # both workers inside a test at once
        return
    mark.write_text("\n".join(m.name for m in ms))
    if mode == "fail":
        assert False, "failing on purpose"
    if mode == "sleep":
        time.sleep(300)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "engine":  # the outer test restarts the Docker engine meanwhile
        end = time.monotonic() + 300
        while time.monotonic() < end:
            machines.exec(ms[0], ["true"])
            time.sleep(0.2)
    if mode in ("leak", "pin"):
        import docker
        from providers.base import L_CLUSTER
        dk = docker.from_env()
        if mode == "leak":  # an object of this run that no fixture owns
            dk.volumes.create(f"{machines.name}-leaked", labels={**machines.owner.labels(),
                                                                  L_CLUSTER: f"{machines.name}-leaked"})
        else:  # the first machine's /var volume in use by a container the harness does not know
            m = ms[0]
            image = dk.containers.get(m.name).image.id
            dk.containers.create(image, ["true"], name=f"{m.name}-pin", volumes={f"{m.name}-var": {"bind": "/x"}})
        dk.close()
