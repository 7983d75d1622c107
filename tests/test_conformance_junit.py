"""The conformance suite's JUnit handling, on reports e2e.test really wrote.

tests/data/conformance/ holds reports produced by running this project's
e2e.test (v1.34.4, built from ci/kube-build):

* ``dryrun-smoke.ginkgo-junit.xml.gz``: ``--ginkgo.dry-run`` with the smoke
  focus (13 specs reported passed, the other 7131 left out by the filter).
* ``nocluster.ginkgo-junit.xml``: a real run against an API server that is
  not there: the SynchronizedBeforeSuite fails, no spec runs.
* ``smoke-cluster.junit_01.xml``: the e2e framework's own report of a real
  ``--conformance-smoke`` run against a 3-node kubeadm cluster of this
  harness (13 passed).
* ``kubectl-failure.junit_01.xml``: the same against that cluster, three
  specs with ``--kubectl-path=/nonexistent/kubectl``: 2 passed, the kubectl
  one failed.

The two cluster reports had their filter-skipped entries (7000+
``<skipped message="skipped"/>`` specs that never ran) removed to stay small.

When an e2e.test binary is cached (or $KUBE_HARNESS_E2E_BINARY is set), a
fresh dry run is parsed too.
"""
from __future__ import annotations

import gzip
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness import conformance as c
from harness import e2e_results, e2e_runner
from harness.build import e2e as e2e_build

DATA = Path(__file__).parent / "data" / "conformance"
#: the smoke specs of the recorded reports (v1.34.4 had no PodCertificate [Conformance] spec)
RECORDED_SMOKE = tuple(s for s in c.SMOKE_SPECS if "PodCertificate" not in s)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def dryrun_report(tmp_path) -> Path:
    p = tmp_path / "dryrun.xml"
    p.write_bytes(gzip.decompress((DATA / "dryrun-smoke.ginkgo-junit.xml.gz").read_bytes()))
    return p


def test_dry_run_report_lists_exactly_the_smoke_specs(dryrun_report):
    results = e2e_results.parse_junit(dryrun_report)
    names = [r.name for r in results]
    assert len(names) == len(RECORDED_SMOKE), names
    for spec in RECORDED_SMOKE:
        assert [n for n in names if n.startswith(spec)], f"{spec} missing from {names}"
    assert all(r.outcome == "passed" and r.node_type == "It" for r in results)
    assert all(n.endswith("[Conformance]") for n in names)  # label suffix "[sig-x, Conformance]" stripped
    assert e2e_results.summary(results) == f"conformance: {len(RECORDED_SMOKE)} passed, 0 failed, 0 skipped"


def test_filtered_specs_can_be_kept(dryrun_report):
    everything = e2e_results.parse_junit(dryrun_report, include_not_run=True)
    assert len(everything) > 7000
    assert e2e_results.counts(everything)["skipped"] == len(everything) - len(RECORDED_SMOKE)


def test_labels_and_sig(dryrun_report):
    r = next(r for r in e2e_results.parse_junit(dryrun_report) if r.name.startswith("[sig-node] Pods should get a host IP"))
    assert r.labels == ("sig-node", "NodeConformance", "Conformance")
    assert r.sig == "sig-node"


def test_before_suite_failure_is_a_failure():
    results = e2e_results.parse_junit(DATA / "nocluster.ginkgo-junit.xml", phase="smoke")
    assert [r.name for r in results] == ["[SynchronizedBeforeSuite]"]
    r = results[0]
    assert r.outcome == "failed" and r.state == "failed"
    assert "connection refused" in r.message
    assert "e2e.go:" in r.detail and r.location.startswith("k8s.io/kubernetes@v1.34.4/test/e2e/e2e.go:")
    assert e2e_results.summary(results) == "conformance: 0 passed, 1 failed, 0 skipped"


def test_cluster_smoke_report():
    results = e2e_results.parse_junit(DATA / "smoke-cluster.junit_01.xml")
    assert e2e_results.counts(results) == {"passed": len(RECORDED_SMOKE), "failed": 0, "skipped": 0}
    assert all(r.seconds > 0 for r in results)
    for spec in RECORDED_SMOKE:
        assert [r for r in results if r.name.startswith(spec)], spec


def test_cluster_failure_names_the_spec():
    results = e2e_results.parse_junit(DATA / "kubectl-failure.junit_01.xml")
    assert e2e_results.summary(results) == "conformance: 2 passed, 1 failed, 0 skipped"
    (bad,) = [r for r in results if r.outcome == "failed"]
    assert bad.name == "[sig-cli] Kubectl client Kubectl version should check is all data is printed [Conformance]"
    assert "fork/exec /nonexistent/kubectl: no such file or directory" in bad.message
    assert bad.message.startswith("error starting /nonexistent/kubectl")
    assert bad.location.startswith("k8s.io/kubernetes@v1.34.4/test/e2e/framework/kubectl/builder.go:")
    assert "STEP:" in bad.detail  # the spec's timeline comes along for the failure report


def test_prow_junit_roundtrip(tmp_path, dryrun_report):
    results = e2e_results.parse_junit(dryrun_report) + e2e_results.parse_junit(DATA / "nocluster.ginkgo-junit.xml")
    out = e2e_results.write_prow_junit(results, tmp_path / "junit_conformance_e2e.xml", properties={"mode": "smoke"})
    root = ET.parse(out).getroot()
    suite = root.find("testsuite")
    assert suite.get("name") == "conformance"
    assert int(suite.get("tests")) == len(results) and int(suite.get("failures")) == 1
    failed = [tc for tc in suite.iter("testcase") if tc.find("failure") is not None]
    assert failed[0].get("name") == "[SynchronizedBeforeSuite]"
    assert "connection refused" in failed[0].find("failure").get("message")
    again = e2e_results.parse_junit(out)  # our own output parses back to the same outcomes
    assert [(r.name, r.outcome) for r in again] == [(r.name, r.outcome) for r in results]


def test_progress_tracker_on_real_output():
    lines = gzip.decompress((DATA / "dryrun-smoke.e2e.log.gz").read_bytes()).decode().splitlines(True)
    t = e2e_runner.ProgressTracker("smoke")
    for line in lines:
        t.feed(line)
    assert t.total == len(RECORDED_SMOKE) == t.done
    assert not t.failed
    assert {n for n, _, _ in t.finished} == {r.name for r in e2e_results.parse_junit(
        _gunzip(DATA / "dryrun-smoke.ginkgo-junit.xml.gz"))}


def test_progress_tracker_parallel_order():
    """ginkgo's parallel (non-streamed) report puts the outcome first."""
    t = e2e_runner.ProgressTracker("parallel")
    for line in ["Will run 2 of 7144 specs\n", "------------------------------\n", "• [3.2 seconds]\n",
                 "[sig-node] Pods should get a host IP [NodeConformance] [Conformance] [sig-node, Conformance]\n",
                 "k8s.io/kubernetes@v1.34.4/test/e2e/common/node/pods.go:205\n",
                 "------------------------------\n", "• [FAILED] [61.0 seconds]\n",
                 "[sig-network] DNS should provide DNS for the cluster [Conformance] [sig-network, Conformance]\n"]:
        t.feed(line)
    assert t.finished == [("[sig-node] Pods should get a host IP [NodeConformance] [Conformance]", "passed", 3.2),
                          ("[sig-network] DNS should provide DNS for the cluster [Conformance]", "failed", 61.0)]
    assert t.failed == ["[sig-network] DNS should provide DNS for the cluster [Conformance]"]


def _gunzip(p: Path) -> Path:
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"kh-{os.getpid()}-{p.stem}"
    out.write_bytes(gzip.decompress(p.read_bytes()))
    return out


def test_phases_and_focus():
    assert [p.name for p in c.phases_for("parallel", nodes=3)] == ["parallel", "serial"]
    par, ser = c.phases_for("parallel", nodes=3, skip=r"\[Flaky\]")
    assert par.skip == r"\[Serial\]|\[Flaky\]" and par.nodes == 3
    assert ser.nodes == 1 and r"\[Serial\]" in ser.focus and ser.skip == r"\[Flaky\]"
    assert [(p.name, p.nodes) for p in c.phases_for("full", nodes=3)] == [("conformance", 1)]
    (smoke,) = c.phases_for("smoke", nodes=4)
    assert smoke.nodes == 2 and smoke.focus == c.smoke_focus()
    assert c.re2_escape("a (b) [c] d.e") == r"a \(b\) \[c\] d\.e"
    with pytest.raises(ValueError):
        c.phases_for("bogus")


def _e2e_binary() -> Path | None:
    env = os.environ.get("KUBE_HARNESS_E2E_BINARY")
    if env:
        return Path(env)
    try:
        p = e2e_build.test_binary_path()
    except Exception:
        return None
    return p if p.exists() else None


def test_fresh_dry_run(tmp_path):
    """Run the cached e2e.test (dry run: no cluster needed) through the runner."""
    e2e = _e2e_binary()
    if e2e is None:
        pytest.skip("no e2e.test built (python -m harness.build --e2e)")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    runner = e2e_runner.E2ERunner(e2e, kubeconfig, tmp_path / "out", dry_run=True)
    res = runner.run(c.phases_for("smoke")[0])
    assert res.returncode == 0, res.log_path.read_text()[-3000:]
    names = [r.name for r in res.results]
    assert len(names) == len(c.SMOKE_SPECS), names
    for spec in c.SMOKE_SPECS:  # every smoke spec exists in this release's e2e.test
        assert [n for n in names if n.startswith(spec)], f"{spec} missing from {names}"
    assert (tmp_path / "out" / "smoke" / "e2e.log").stat().st_size > 0


HOOK_TEST = '''
from harness.e2e_results import parse_junit
import gzip, pathlib

def test_conformance(request):
    results = []
    for name in ("nocluster.ginkgo-junit.xml", "smoke-cluster.junit_01.xml", "kubectl-failure.junit_01.xml"):
        p = pathlib.Path(r"{data}") / name
        if p.exists():
            results += parse_junit(p)
    request.node._kh_e2e_specs = ("conformance", results)
'''


def test_each_spec_becomes_a_pytest_result(tmp_path):
    """The plugin's hook reports every e2e spec to pytest (terminal, junitxml)."""
    (tmp_path / "test_inner.py").write_text(HOOK_TEST.format(data=DATA))
    xml = tmp_path / "inner.xml"
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                        "-rA", f"--junitxml={xml}", str(tmp_path)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = p.stdout + p.stderr
    expected = [r for name in ("nocluster.ginkgo-junit.xml", "smoke-cluster.junit_01.xml",
                               "kubectl-failure.junit_01.xml") for r in e2e_results.parse_junit(DATA / name)]
    cnt = e2e_results.counts(expected)
    assert cnt == {"passed": 15, "failed": 2, "skipped": 0}
    assert p.returncode == 1, out
    assert "test_inner.py::test_conformance::[SynchronizedBeforeSuite]" in out
    assert ("FAILED test_inner.py::test_conformance::[sig-cli] Kubectl client Kubectl version should check is all "
            "data is printed [Conformance]") in out
    cases = list(ET.parse(xml).getroot().iter("testcase"))
    assert len(cases) == 1 + len(expected), out
    by_name = {tc.get("name"): tc for tc in cases}
    bs = by_name["[SynchronizedBeforeSuite]"]
    assert "connection refused" in bs.find("failure").get("message")
    failed = sum(1 for tc in cases if tc.find("failure") is not None)
    assert failed == cnt["failed"]
    summary_words = f"{cnt['failed']} failed, {cnt['passed'] + 1} passed"
    assert summary_words in out, out[-2000:]


# ------------------------------------------------------- images and loading

def _manifest_text() -> str:
    from harness.build import e2eimages
    try:
        return (e2eimages.module_dir() / "test/utils/image/manifest.go").read_text()
    except Exception as e:  # no Go / module cache
        pytest.skip(f"k8s.io/kubernetes module source not available: {e}")


def test_manifest_and_repo_list_cover_the_conformance_images():
    from harness.build import e2eimages
    text = _manifest_text()
    refs = e2eimages.parse_manifest(text)
    assert refs["Agnhost"].upstream == "registry.k8s.io/e2e-test-images/agnhost:2.66.1"  # v1.37.2
    assert refs["Pause"].registry_key == "gcRegistry"
    assert refs["Agnhost"].local("kube-harness.local") == "kube-harness.local/e2e-test-images/agnhost:2.66.1"
    assert refs["Pause"].local("kube-harness.local") == "kube-harness.local/pause:3.10.2"
    # every registry key e2e.test reads from KUBE_TEST_REPO_LIST is mapped
    import re
    keys = set(re.findall(r'`yaml:"(\w+)"`', text))
    assert keys <= set(e2eimages.repo_list())  # older releases read gcAuthenticatedRegistry too
    # what v1.37's [Conformance] specs run is built; older releases' names stay for their manifests
    assert {"Agnhost", "AgnhostPrev", "BusyBox", "Pause", "GlibcDnsTesting", "Nginx", "NginxNew", "Kitten",
            "Nautilus", "NonRoot", "Nonewprivs", "APIServer"} <= set(refs) & set(e2eimages.CONFORMANCE_IMAGES)
    assert set(e2eimages.CONFORMANCE_IMAGES) <= set(e2eimages.RECIPES)
    assert set(e2eimages.SMOKE_IMAGES) <= set(e2eimages.CONFORMANCE_IMAGES)


def test_write_repo_list(tmp_path):
    import yaml
    from harness.build import e2eimages
    p = e2eimages.write_repo_list(tmp_path / "repo.yaml", "reg.example")
    data = yaml.safe_load(p.read_text())
    assert data["promoterE2eRegistry"] == "reg.example/e2e-test-images"
    assert data["gcRegistry"] == "reg.example"
    assert data["invalidRegistry"] == "invalid.registry.k8s.io/invalid"  # must stay unreachable


def test_image_load_planning():
    from harness.images_load import missing_on, normalize
    assert normalize("busybox") == "docker.io/library/busybox:latest"
    assert normalize("foo/bar:1") == "docker.io/foo/bar:1"
    assert normalize("kube-harness.local/e2e-test-images/agnhost:2.56") == \
        "kube-harness.local/e2e-test-images/agnhost:2.56"
    ids = {"kube-harness.local/a:1": "sha256:aa", "kube-harness.local/b:1": "sha256:bb", "c:1": "sha256:cc"}
    node = {"kube-harness.local/a:1": "sha256:aa", "kube-harness.local/b:1": "sha256:old",
            "docker.io/library/c:1": "sha256:cc"}
    assert missing_on(node, ids) == ["kube-harness.local/b:1"]  # b is there, but another image
