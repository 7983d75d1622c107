"""Run by tests/test_teardown.py in a child pytest: uses the `machines` fixture,
then behaves as INNER_MODE says (pass, fail, sleep for Ctrl-C, kill the worker,
record which machines each xdist worker got)."""
import os
import signal
import time
from pathlib import Path

import pytest


@pytest.mark.parametrize("i", range(2) if os.environ.get("INNER_MODE") == "record" else [0])
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
