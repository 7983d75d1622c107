"""``kube-harness capi-init --kubeconfig`` refuses bad input before anything is
built or contacted. Its install into a cluster known only by its kubeconfig runs
in test_providers.py (into the workload cluster, before ``clusterctl move``)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "capi-init", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_capi_init_refuses_a_missing_kubeconfig(tmp_path):
    p = run("--kubeconfig", str(tmp_path / "nope"))
    assert p.returncode == 2
    assert f"invalid --kubeconfig: '{tmp_path / 'nope'}'; allowed: an existing kubeconfig file" in p.stderr


def test_capi_init_refuses_a_bad_variable(tmp_path):
    kc = tmp_path / "kubeconfig"
    kc.write_text("apiVersion: v1\nkind: Config\n")
    p = run("--kubeconfig", str(kc), "--var", "NOVALUE")
    assert p.returncode == 2
    assert "invalid --var: 'NOVALUE'; allowed: NAME=VALUE" in p.stderr
