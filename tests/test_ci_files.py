"""The CI definitions users and GitHub run: the workflow and the composite
action are checked by actionlint (built from the Go module proxy) with
shellcheck, and they run what the README says."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "e2e.yaml"
ACTION = ROOT / "action.yml"


@pytest.fixture(scope="module")
def actionlint() -> Path:
    from harness.build.runtime import build_actionlint
    return build_actionlint() / "bin" / "actionlint"


def test_workflows_pass_actionlint(actionlint):
    """actionlint checks the workflow, the inputs it gives the local composite action
    (``uses: ./``) and, with shellcheck, its run scripts."""
    assert shutil.which("shellcheck"), "shellcheck is missing (ci/setup.sh installs it)"
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))
    assert workflows == [WORKFLOW]
    p = subprocess.run([str(actionlint), "-no-color", "-oneline", *map(str, workflows)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_action_scripts_pass_shellcheck(tmp_path):
    steps = yaml.safe_load(ACTION.read_text())["runs"]["steps"]
    scripts = [s["run"] for s in steps if "run" in s]
    assert scripts and all(s["shell"] == "bash" for s in steps if "run" in s)
    for i, script in enumerate(scripts):
        f = tmp_path / f"step{i}.sh"
        # the ${{ }} expressions are only in env:, so the script is plain bash
        assert "${{" not in script, script
        f.write_text("#!/usr/bin/env bash\n" + script)
        p = subprocess.run(["shellcheck", "-s", "bash", str(f)], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr


def test_workflow_runs_the_readme_test_command():
    """The test job runs .ci/run, which runs the README's test command exactly."""
    wf = yaml.safe_load(WORKFLOW.read_text())
    test = wf["jobs"]["test"]
    assert test["runs-on"] == "ubuntu-24.04" and test["timeout-minutes"] <= 90
    assert any(s.get("run", "").endswith("bash .ci/run") for s in test["steps"])
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## The two commands", 1)[1].split("```", 2)[1]
    commands = [l for l in block.splitlines() if l and not l.startswith(("#", "sh"))]
    run = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in run, (commands, run)
    main = wf["jobs"]["main-job"]
    uses = [s for s in main["steps"] if s.get("uses") == "./"]
    assert uses and uses[0]["with"]["suites"] == "suites/kubeadm"
    assert re.search(r"\bsuites/kubeadm\b", commands[0])


def test_action_inputs_reach_pytest():
    action = yaml.safe_load(ACTION.read_text())
    run = action["runs"]["steps"][-1]
    for name, var in (("suites", "SUITES"), ("cluster-config", "CLUSTER_CONFIG"),
                      ("kubernetes-version", "KUBERNETES_VERSION"), ("pytest-args", "PYTEST_ARGS")):
        assert name in action["inputs"]
        assert run["env"][var] == f"${{{{ inputs.{name} }}}}"
        assert f"${var}" in run["run"], var


IMPORT_NAMES = {"pytest-xdist": "xdist", "junit-xml": "junit_xml", "PyYAML": "yaml"}


def test_every_declared_dependency_is_used():
    import tomllib
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.split(r"[<>=\[ ;]", d, maxsplit=1)[0] for d in deps]
    sources = "\n".join(p.read_text() for d in ("harness", "providers", "suites", "tests")
                        for p in (ROOT / d).rglob("*.py"))
    for name in names:
        module = IMPORT_NAMES.get(name, name.replace("-", "_"))
        if module == "xdist":  # a pytest plugin: used through -n
            assert re.search(r'"-n", "2"', sources), name
            continue
        assert re.search(rf"^\s*(import|from) {module}\b", sources, re.M), f"{name} is declared but not imported"
