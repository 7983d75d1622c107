"""Certify mode (``--conformance-mode=certify``): the options it refuses, the
e2e command it runs, what that command selects from the real e2e.test, the
cncf/k8s-conformance skeletons it writes, and (slow, real cluster) the whole
path narrowed to four specs by the self-test hook.

A full certification run (462 specs serially, about an hour on a 2-core
machine) is not run here; the dry run below shows it would select exactly the
release's conformance list.
"""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from harness import __version__, certify
from harness import conformance as c
from harness import e2e_results, e2e_runner
from harness.build import e2e as e2e_build
from harness.spec import SpecError

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data" / "conformance"
MODE = "--conformance-mode=certify"

#: for the self-test: fast [Conformance] specs, one of them [Serial] (certify skips nothing), one running
#: kubectl (certify finds it on PATH, as the conformance image does, with no --kubectl-path)
SELFTEST_SPECS = (
    "[sig-node] Pods should get a host IP",
    "[sig-api-machinery] Namespaces should patch a Namespace",
    "[sig-network] DNS should provide DNS for the cluster",
    "[sig-cli] Kubectl client Kubectl version should check is all data is printed",
)


def selftest_focus(specs=SELFTEST_SPECS) -> str:
    return "|".join(c.re2_escape(s) for s in specs)


# ---------------------------------------------------------------- options

def test_each_refused_option_is_named_with_its_value():
    cases = [
        ({"smoke": True}, "invalid --conformance-smoke: True; allowed: not with --conformance-mode=certify: "
                          r"certification runs every [Conformance] spec (focus \[Conformance\], no skip), "
                          "serially, once"),
        ({"focus": "Pods"}, "invalid --conformance-focus: 'Pods'; allowed: none with --conformance-mode=certify"),
        ({"skip": r"\[Serial\]"}, r"invalid --conformance-skip: '\\[Serial\\]'; allowed: none with"),
        ({"dry_run": True}, "invalid --e2e-dry-run: True; allowed: not with --conformance-mode=certify: a dry run "
                            "certifies nothing"),
        ({"parallel": 3}, "invalid --e2e-parallel: 3; allowed: 1 with --conformance-mode=certify"),
        ({"e2e_args": ["--ginkgo.flake-attempts=3"]},
         "invalid --e2e-arg: '--ginkgo.flake-attempts=3'; allowed: e2e.test's own flags with "
         "--conformance-mode=certify, not ginkgo's"),
        ({"e2e_args": ["-ginkgo.focus=Pods"]}, "invalid --e2e-arg: '-ginkgo.focus=Pods'; allowed: e2e.test's own"),
        ({"e2e_args": ["--report-dir=/tmp/x"]}, "invalid --e2e-arg: '--report-dir=/tmp/x'; allowed: flags other "
                                                "than --report-dir and --report-prefix"),
        ({"reruns": 2}, "invalid --reruns: 2; allowed: 0 with --conformance-mode=certify: no retries"),
    ]
    for kwargs, expected in cases:
        with pytest.raises(SpecError) as e:
            certify.check_options(**kwargs)
        assert str(e.value).startswith(expected), (kwargs, str(e.value))
        assert "\n" not in str(e.value)


def test_all_refusals_at_once_and_what_stays_allowed():
    with pytest.raises(SpecError) as e:
        certify.check_options(smoke=True, focus="x", skip="y", e2e_args=["--allowed-not-ready-nodes=1",
                                                                         "--ginkgo.label-filter=Slow"])
    lines = str(e.value).splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["invalid --conformance-smoke", "invalid --conformance-focus",
                                                  "invalid --conformance-skip", "invalid --e2e-arg"]
    # e2e.test's own flags, one process, no retries: a certification run
    certify.check_options(parallel=1, e2e_args=["--allowed-not-ready-nodes=1", "--node-os-distro=debian"])
    certify.check_options()


def run_pytest(*args: str, env: dict | None = None, timeout: float = 300) -> tuple[int, str]:
    """The real pytest on this checkout (its plugin, conftests and suites)."""
    e = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    for k in ("PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS", "KUBE_HARNESS_CONFIG",
              "KUBE_HARNESS_CONFORMANCE_MODE", c.CERTIFY_SELFTEST_ENV):
        if k not in (env or {}):
            e.pop(k, None)
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT, env=e,
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def test_pytest_refuses_before_anything_is_made(tmp_path):
    art = tmp_path / "art"
    rc, out = run_pytest("suites/conformance", MODE, "--conformance-focus=Pods", "--e2e-parallel=2",
                         "--e2e-arg=--ginkgo.flake-attempts=2", "--no-reap", env={"ARTIFACTS": str(art)})
    assert rc == 4, out  # pytest's usage error
    assert "ERROR: invalid --conformance-focus: 'Pods'; allowed: none with --conformance-mode=certify" in out
    assert "invalid --e2e-parallel: 2; allowed: 1 with --conformance-mode=certify" in out
    assert "invalid --e2e-arg: '--ginkgo.flake-attempts=2'; allowed:" in out
    assert not (art / "conformance").exists() and not (art / "metadata.json").exists()  # no session ran
    # the mode from the environment, a flag from the command line
    rc, out = run_pytest("suites/conformance", "--conformance-smoke", "--no-reap",
                         env={"ARTIFACTS": str(art), "KUBE_HARNESS_CONFORMANCE_MODE": "certify"})
    assert rc == 4 and "ERROR: invalid --conformance-smoke: True; allowed: not with --conformance-mode=certify" \
        in out, out


# ---------------------------------------------------------------- command

def test_certify_command_is_the_go_runners(tmp_path):
    """ginkgo --focus=\\[Conformance\\] --skip= --no-color=true -v --timeout=24h
    e2e.test -- --disable-log-dump --provider=skeleton --report-dir=DIR
    --kubeconfig=FILE: one process, no skip, no flake attempts."""
    (phase,) = c.phases_for("certify", nodes=3)
    assert (phase.name, phase.focus, phase.skip, phase.nodes, phase.upstream) == \
        ("certify", r"\[Conformance\]", "", 1, True)
    runner = e2e_runner.E2ERunner(Path("/e2e/e2e.test"), Path("/k/kubeconfig"), tmp_path, ginkgo=Path("/g/ginkgo"),
                         kubectl=Path("/b/kubectl"), extra_args=["--allowed-not-ready-nodes=1"])
    cmd = runner.command(phase, tmp_path / "certify")
    assert cmd[0] == "/g/ginkgo" and cmd.count("/e2e/e2e.test") == 1 and cmd.count("--") == 1
    sep = cmd.index("--")
    assert cmd[sep - 1] == "/e2e/e2e.test"
    ginkgo, e2e = cmd[1:sep - 1], cmd[sep + 1:]
    assert ginkgo == [r"--focus=\[Conformance\]", "--skip=", "--no-color=true", "-v", "--timeout=24h"]
    assert e2e == ["--disable-log-dump", "--provider=skeleton", f"--report-dir={tmp_path / 'certify'}",
                   "--kubeconfig=/k/kubeconfig", "--allowed-not-ready-nodes=1"]
    everything = " ".join(cmd)
    for never in ("--procs", "--nodes", "--p ", "-p=", "flake-attempts", "repeat", "label-filter", "dry-run",
                  "ginkgo.", "--kubectl-path"):
        assert never not in everything, never
    with pytest.raises(ValueError):
        c.phases_for("certify", focus="Pods")
    with pytest.raises(ValueError):
        c.phases_for("certify", skip="Serial")
    (narrowed,) = c.phases_for("certify", selftest_focus="a|b")
    assert narrowed.focus == r"(a|b).*\[Conformance\]" and narrowed.skip == "" and narrowed.nodes == 1


def _binaries() -> tuple[Path, Path]:
    e2e = Path(os.environ["KUBE_HARNESS_E2E_BINARY"]) if os.environ.get("KUBE_HARNESS_E2E_BINARY") else e2e_build.test_binary_path()
    if not e2e.exists():
        pytest.skip("no e2e.test built (python -m harness.build --e2e)")
    return e2e, e2e_build.ensure_ginkgo()  # the ginkgo CLI builds in under a minute when missing


def _conformance_list(version: str) -> set[str]:
    """The release's own list of conformance tests (what the CNCF's bot checks junit_01.xml against)."""
    from harness.build import e2eimages
    try:
        doc = yaml.safe_load((e2eimages.module_dir(version) / "test/conformance/testdata/conformance.yaml").read_text())
    except Exception as e:
        pytest.skip(f"k8s.io/kubernetes {version} module source not available: {e}")
    return {t["codename"] for t in doc}


def test_certify_selects_exactly_the_releases_conformance_tests(tmp_path):
    """The certify command (with ginkgo's --dry-run, as E2E_DRYRUN adds it)
    on the real ginkgo and e2e.test selects every spec of the release's
    conformance.yaml and nothing else, and its directory holds only what a
    submission does."""
    from harness.build import kube
    e2e, ginkgo = _binaries()
    version = kube.default_version()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    res = e2e_runner.E2ERunner(e2e, kubeconfig, tmp_path, ginkgo=ginkgo, dry_run=True).run(c.certify_phase())
    assert res.returncode == 0, res.log_path.read_text()[-3000:]
    assert res.command[0] == str(ginkgo) and "--dry-run=true" in res.command
    expected = _conformance_list(version)
    assert len(expected) > 400
    assert {r.name for r in res.results} == expected
    assert all(r.outcome == "passed" for r in res.results)
    assert f"Will run {len(expected)} of" in res.log_path.read_text()
    assert sorted(p.name for p in (tmp_path / "certify").iterdir()) == ["e2e.log", "junit_01.xml"]
    props = {p.get("name"): p.get("value") for p in ET.parse(res.junit_path).getroot().iter("property")}
    assert props["FocusStrings"] == r"\[Conformance\]" and props["SkipStrings"] == ""


# -------------------------------------------------------------- skeletons

FACTS = certify.Facts(
    "v1.37.2", server="v1.37.2", e2e="v1.37.2", e2e_path="/cache/e2e.test", harness_commit="abc123",
    provider="docker", spec_yaml="apiVersion: harness.k8s.io/v1alpha1\nkind: Cluster\n",
    nodes=[{"name": "kh-control-plane", "roles": "control-plane", "os": "Debian GNU/Linux 13 (trixie)",
            "kernel": "6.1.0", "runtime": "containerd://2.4.2", "kubelet": "v1.37.2", "arch": "amd64"},
           {"name": "kh-md-0-a", "roles": "worker", "os": "Debian GNU/Linux 13 (trixie)", "kernel": "6.1.0",
            "runtime": "containerd://2.4.2", "kubelet": "v1.37.2", "arch": "amd64"}])


def _run_in(d: Path, junit: Path) -> e2e_runner.PhaseResult:
    """A certify phase's result as the runner leaves it: e2e.log and
    junit_01.xml in the phase directory (a real report of this harness's e2e)."""
    d.mkdir(parents=True)
    (d / "e2e.log").write_text("e2e test version: v1.37.2\n")
    (d / "junit_01.xml").write_bytes(junit.read_bytes())
    cmd = ["/g/ginkgo", r"--focus=\[Conformance\]", "--skip=", "/e2e.test", "--", "--report-dir=" + str(d)]
    return e2e_runner.PhaseResult(c.certify_phase(), 1, 3600.0, d / "e2e.log", d / "junit_01.xml",
                         e2e_results.parse_junit(d / "junit_01.xml"), command=cmd)


def test_skeletons_in_the_submission_layout(tmp_path):
    run = _run_in(tmp_path / "certify", DATA / "kubectl-failure.junit_01.xml")  # 2 passed, 1 failed
    d = certify.write_submission(run, FACTS)
    assert sorted(p.name for p in d.iterdir()) == sorted(certify.SUBMISSION_FILES)
    text = (d / "PRODUCT.yaml").read_text()
    product = yaml.safe_load(text)
    assert list(product) == [k for k, _ in certify.PRODUCT_FIELDS] == [
        "vendor", "name", "version", "website_url", "repo_url", "documentation_url", "product_logo_url", "type",
        "description", "contact_email_address"]
    assert all(isinstance(v, str) and v.startswith("TODO: ") for v in product.values()), product
    assert "not the Kubernetes version" in product["version"]
    comments = "\n".join(ln for ln in text.splitlines() if ln.startswith("#"))
    for fact in ("v1.37/<product>/", "Kubernetes v1.37.2", f"kube-harness {__version__} (abc123)",
                 "Debian GNU/Linux 13 (trixie)", "containerd://2.4.2"):
        assert fact in comments, fact
    assert certify.NOT_A_CERTIFICATION not in text
    readme = (d / "README.md").read_text()
    assert readme.startswith("# Conformance results for v1.37/TODO")
    assert "2 passed, 1 failed, 0 skipped (1 failed: this run cannot be submitted); e2e exit 1 after 1h00m00s" \
        in readme
    assert "- [sig-cli] Kubectl client Kubectl version should check is all data is printed [Conformance]" in readme
    for fact in ("- Kubernetes: v1.37.2 (the API server reports v1.37.2)", "- e2e.test: v1.37.2 (/cache/e2e.test)",
                 f"- kube-harness: {__version__}, commit abc123", "| kh-md-0-a | worker | Debian GNU/Linux 13 (trixie) "
                 "| 6.1.0 | containerd://2.4.2 | v1.37.2 | amd64 |", "kind: Cluster", r"--focus=\[Conformance\]",
                 "--mode=certified-conformance", "TODO: how to install the product", "KUBE_TEST_REPO_LIST",
                 "`Conformance results for v1.37/<product>`"):
        assert fact in readme, fact
    assert certify.NOT_A_CERTIFICATION not in readme


def test_selftest_skeletons_say_not_a_certification(tmp_path):
    run = _run_in(tmp_path / "certify", DATA / "smoke-cluster.junit_01.xml")  # 13 passed
    d = certify.write_submission(run, certify.Facts("v1.37.2"), selftest="Pods")
    text = (d / "PRODUCT.yaml").read_text()
    assert text.splitlines()[0].startswith(f"# {certify.NOT_A_CERTIFICATION}: a kube-harness self-test")
    assert yaml.safe_load(text)["description"].startswith(certify.NOT_A_CERTIFICATION)
    readme = (d / "README.md").read_text()
    assert f"> **{certify.NOT_A_CERTIFICATION}.**" in readme and f"`{c.CERTIFY_SELFTEST_ENV}='Pods'`" in readme
    assert "13 passed, 0 failed, 0 skipped (all passed)" in readme
    # what could not be read says so instead of guessing
    assert "API server reports unknown" in readme and "Nodes: unknown" in readme
    assert "runtime unknown" in text


def test_a_cluster_given_by_kubeconfig_is_not_said_to_be_made_here(tmp_path):
    run = _run_in(tmp_path / "certify", DATA / "smoke-cluster.junit_01.xml")
    facts = certify.Facts("v1.37.2", provider=certify.EXISTING, kubeconfig="/home/v/.kube/config")
    readme = (certify.write_submission(run, facts) / "README.md").read_text()
    assert "kube-harness did not make the tested cluster: it was given by its kubeconfig" in readme
    assert "python3 -m pytest suites/conformance --conformance-mode=certify --kubeconfig FILE" in readme
    assert "made by kube-harness from this spec" not in readme and "/home/v" not in readme
    assert "TODO: how to install the product and create the cluster" in readme


def test_clear_leaves_no_stale_files(tmp_path):
    d = tmp_path / "certify"
    d.mkdir()
    (d / "README.md").write_text("an earlier run")
    (d / "sub").mkdir()
    assert certify.clear(d) == d and list(d.iterdir()) == []
    assert certify.clear(tmp_path / "new").is_dir()


# -------------------------------------------------- the real path, narrowed

def _docker_objects(cluster: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-a", "--filter", f"label=harness.k8s.io/cluster={cluster}",
                          "--format", "{{.Names}}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.cluster
@pytest.mark.conformance
def test_certify_selftest_on_a_real_cluster(tmp_path, write_spec):
    """``pytest suites/conformance --conformance-mode=certify`` on a real
    cluster of its own, narrowed by the self-test hook to four specs: the
    submission files appear in the layout, junit_01.xml parses and holds the
    four, e2e.log carries what the CNCF's bot looks for, each spec is its own
    pytest result, and PRODUCT.yaml and README.md say NOT A CERTIFICATION."""
    from harness.build import kube
    version = kube.default_version()
    spec, name = write_spec("kc")
    art = tmp_path / "art"
    assert _docker_objects(name) == []
    rc, out = run_pytest("suites/conformance", MODE, f"--cluster-config={spec}", "--no-reap",
                         env={"ARTIFACTS": str(art), c.CERTIFY_SELFTEST_ENV: selftest_focus()}, timeout=3600)
    (tmp_path / "pytest-output.txt").write_text(out)
    assert _docker_objects(name) == []  # torn down
    assert rc == 0, out[-6000:]
    d = art / "conformance" / "certify"
    assert sorted(p.name for p in d.iterdir()) == sorted(certify.SUBMISSION_FILES), out[-3000:]

    root = ET.parse(d / "junit_01.xml").getroot()
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["FocusStrings"] == f"({selftest_focus()}).*" + r"\[Conformance\]" and props["SkipStrings"] == ""
    results = e2e_results.parse_junit(d / "junit_01.xml")
    assert len(results) == len(SELFTEST_SPECS) and all(r.outcome == "passed" for r in results), results
    # each spec is its own pytest result (the session's JUnit in $ARTIFACTS, by the harness plugin)
    cases = {tc.get("name"): tc for tc in ET.parse(art / "junit_conformance.xml").getroot().iter("testcase")}
    for s in SELFTEST_SPECS:
        (r,) = [r for r in results if r.name.startswith(s)]
        assert "[Conformance]" in r.name
        assert cases[r.name].get("classname") == "suites.conformance.test_conformance.test_conformance"
        assert [e.tag for e in cases[r.name]] == ["properties"]  # no failure, error or skipped element
    assert f"{len(SELFTEST_SPECS) + 1} passed" in out  # the specs and the umbrella test
    log = (d / "e2e.log").read_text()
    assert f"e2e test version: {version}" in log  # verify-conformance's check
    assert f"Ran {len(SELFTEST_SPECS)} of " in log and "SUCCESS!" in log

    product_text = (d / "PRODUCT.yaml").read_text()
    product = yaml.safe_load(product_text)
    assert product_text.startswith(f"# {certify.NOT_A_CERTIFICATION}")
    assert product["description"].startswith(certify.NOT_A_CERTIFICATION)
    assert f"Kubernetes {version} (API server {version})" in product_text
    readme = (d / "README.md").read_text()
    assert f"> **{certify.NOT_A_CERTIFICATION}.**" in readme
    assert f"{len(SELFTEST_SPECS)} passed, 0 failed, 0 skipped (all passed)" in readme
    assert f"- e2e.test: {version} " in readme and f"- kube-harness: {__version__}" in readme
    assert "containerd://" in readme and f"| {version} |" in readme  # the nodes' runtime and kubelet
    assert f"name: {name}" in readme  # the cluster spec
    meta = yaml.safe_load((art / "metadata.json").read_text())
    assert meta["conformance-mode"] == "certify" and "NOT a certification" in meta["conformance-certify-selftest"]
    assert meta["job-version"] == version
