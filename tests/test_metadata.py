"""$ARTIFACTS/metadata.json (harness/metadata.py): the flat JSON object of
strings Prow's sidecar merges into finished.json, written by the controller
at the end of each session and merged with what is already there."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness import __version__, metadata

ROOT = Path(__file__).resolve().parent.parent


def test_write_merges_with_what_is_there(tmp_path):
    (tmp_path / "metadata.json").write_text(json.dumps({"infra-commit": "abc", "job-version": "v1.36.3",
                                                        "links": {"a": "b"}}))
    p = metadata.write({"job-version": "v1.37.2", "revision": "v1.37.2", "empty": ""}, tmp_path)
    assert p == tmp_path / "metadata.json"
    assert json.loads(p.read_text()) == {"infra-commit": "abc", "job-version": "v1.36.3,v1.37.2",
                                         "links": {"a": "b"}, "revision": "v1.37.2"}
    metadata.write({"job-version": "v1.37.2"}, tmp_path)  # a value already there is not repeated
    assert json.loads(p.read_text())["job-version"] == "v1.36.3,v1.37.2"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["metadata.json"]  # no lock or temp file left


def test_an_unreadable_file_is_kept_aside(tmp_path):
    (tmp_path / "metadata.json").write_text("[1, 2")
    metadata.write({"k8s-version": "v1.37.2"}, tmp_path)
    assert json.loads((tmp_path / "metadata.json").read_text()) == {"k8s-version": "v1.37.2"}
    assert (tmp_path / "metadata.json.invalid").read_text() == "[1, 2"


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_controller_writes_it_at_session_end(tmp_path):
    """A real session with two xdist workers on suites/kubeadm and
    suites/conformance (the harness plugin registers it), deselecting every test so no cluster is made."""
    art = tmp_path / "art"
    art.mkdir()
    (art / "metadata.json").write_text(json.dumps({"infra-commit": "from-an-earlier-step"}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ARTIFACTS": str(art)}
    for k in ("PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS", "KUBE_HARNESS_CONFIG",
              "KUBE_HARNESS_CONFORMANCE_MODE"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "suites/kubeadm",
                        "suites/conformance", "--conformance-mode=full", "--kubernetes-version=v1.36.3", "-n", "2",
                        "-k", "no_such_test", "--no-reap"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 5, out  # collected, all deselected
    data = json.loads((art / "metadata.json").read_text())
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert data.pop("kube-harness-commit").startswith(head.strip() or os.environ.get("PULL_PULL_SHA", "?"))
    assert data == {"infra-commit": "from-an-earlier-step", "job-version": "v1.36.3", "revision": "v1.36.3",
                    "k8s-version": "v1.36.3", "kube-harness-version": __version__, "kube-harness-provider": "docker",
                    "kube-harness-mode": "direct", "conformance-mode": "full"}
    wrote = [r for r in _records(art / "harness.jsonl") if r.get("event") == "metadata"]
    assert len(wrote) == 1 and wrote[0]["msg"] == f"wrote {art / 'metadata.json'}", out
    workers = sorted(art.glob("harness-gw*.jsonl"))
    assert [w.name for w in workers] == ["harness-gw0.jsonl", "harness-gw1.jsonl"], out  # the workers ran ...
    assert not [r for w in workers for r in _records(w) if r.get("event") == "metadata"]  # ... and wrote nothing


def test_prow_jobs_follow_the_conventions():
    """ci/prow-job.yaml: decorated (ARTIFACTS=/logs/artifacts comes from the
    decoration, so no job sets it), the README's command, the same container
    set-up for the periodic and the presubmit, TestGrid annotations."""
    import yaml
    doc = yaml.safe_load((ROOT / "ci" / "prow-job.yaml").read_text())
    jobs = doc["periodics"] + [j for js in doc["presubmits"].values() for j in js]
    assert [j["name"] for j in jobs] == ["ci-kube-harness-kubeadm", "pull-kube-harness-kubeadm"]
    specs = []
    for j in jobs:
        assert j["decorate"] is True and j["decoration_config"]["timeout"]
        assert {"testgrid-dashboards", "testgrid-tab-name", "description"} <= set(j["annotations"]), j["name"]
        (ctr,) = j["spec"]["containers"]
        assert ctr["command"] == ["bash", ".ci/run"] and ctr["securityContext"]["privileged"] is True
        assert "ARTIFACTS" not in {e["name"] for e in ctr.get("env", [])}
        assert {m["name"] for m in ctr["volumeMounts"]} == {v["name"] for v in j["spec"]["volumes"]}
        specs.append((ctr["volumeMounts"], j["spec"]["volumes"], ctr["resources"]))
    assert specs[0] == specs[1]
    assert 'ARTIFACTS="${ARTIFACTS:-' in (ROOT / ".ci" / "run").read_text()  # Prow's value is kept
