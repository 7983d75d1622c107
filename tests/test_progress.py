"""Progress in any log: under pytest, with output captured and stderr a pipe (as
in CI), provisioning and teardown print one line per phase with its elapsed time."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.cluster, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent


def test_phases_print_in_a_captured_non_terminal_run(tmp_path, write_spec):
    spec, name = write_spec("kh-prog", workers=1)
    test = tmp_path / "test_uses_cluster.py"
    test.write_text("def test_nodes(cluster):\n    assert len(cluster.core.list_node().items) == 2\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KUBE_HARNESS_"))}
    env["ARTIFACTS"] = str(tmp_path / "artifacts")
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--no-reap", str(test),
                        "--cluster-config", str(spec), "--rootdir", str(tmp_path)], cwd=tmp_path, env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    for ph in ("machines", "init", "join", "ready", "teardown"):
        line = rf"^kube-harness \[ *\d+\.\ds\] cluster={name} phase={ph}( machine=\S+)? done in \d+\.\ds$"
        assert re.search(line, p.stderr, re.M), f"no line for phase {ph}:\n{p.stderr[-4000:]}"
    # and the same records as JSON lines in $ARTIFACTS
    assert '"phase": "teardown"' in (tmp_path / "artifacts" / "harness.jsonl").read_text()
