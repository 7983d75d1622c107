"""Run by tests/test_teardown.py in a child pytest: uses the `machines` fixture,
then behaves as INNER_MODE says (pass, fail, sleep for Ctrl-C, kill the worker)."""
import os
import signal
import time
from pathlib import Path


def test_inner(machines):
    ms = machines.machines()
    assert ms, "no machines"
    Path(os.environ["INNER_MARK"]).write_text("\n".join(m.name for m in ms))
    mode = os.environ.get("INNER_MODE", "pass")
    if mode == "fail":
        assert False, "failing on purpose"
    if mode == "sleep":
        time.sleep(300)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
