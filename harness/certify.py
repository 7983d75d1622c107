"""Certification runs (``--conformance-mode=certify``) and their output in the
layout of a cncf/k8s-conformance submission.

A submission is a directory ``vX.Y/<product>/`` holding ``e2e.log`` (the test
log), ``junit_01.xml`` (the e2e framework's report), ``PRODUCT.yaml`` (who
certifies what) and ``README.md`` (how to reproduce).  Certify mode runs
every ``[Conformance]`` spec serially, once, with no skip, as the conformance
image's go-runner does for ``sonobuoy --mode=certified-conformance`` and
``hydrophone --conformance`` (:meth:`harness.e2e_runner.E2ERunner.upstream_command`),
and writes ``$ARTIFACTS/conformance/certify/`` with exactly those four files:
the first two from the run itself (the ginkgo output and ``--report-dir``),
the last two as skeletons filled with what the harness knows (versions, the
nodes' OS and runtime, the cluster spec, the command, the result) and
``TODO`` where the vendor must write.

* :func:`check_options`: the options certify refuses (focus, skip, smoke,
  dry run, several processes, ginkgo flags, retries), all at once.
* :func:`gather` -> :class:`Facts` from a real cluster; :func:`product_yaml`,
  :func:`readme`, :func:`write_submission`.

$KUBE_HARNESS_CERTIFY_SELFTEST_FOCUS (:data:`harness.conformance.CERTIFY_SELFTEST_ENV`)
is for the harness's own tests: it narrows the focus to a few specs and the
skeletons then say NOT A CERTIFICATION.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import yaml

from . import __version__
from .conformance import CERTIFY_SELFTEST_ENV, CONFORMANCE_FOCUS
from .e2e_results import counts
from .e2e_runner import PhaseResult
from .spec import SpecError

SUBMISSION_FILES = ("e2e.log", "junit_01.xml", "PRODUCT.yaml", "README.md")
NOT_A_CERTIFICATION = "NOT A CERTIFICATION"
TODO = "TODO"

#: PRODUCT.yaml's fields (cncf/k8s-conformance instructions.md) and what the vendor writes there
PRODUCT_FIELDS = (
    ("vendor", "the legal entity that certifies (a signed CNCF participation form on file)"),
    ("name", "the product's name"),
    ("version", "the product's version (not the Kubernetes version)"),
    ("website_url", "the product's website"),
    ("repo_url", "the product's source repository, for open source products (a mirror is fine)"),
    ("documentation_url", "the product's documentation"),
    ("product_logo_url", "the product's logo with its name, in SVG, AI or EPS"),
    ("type", "distribution, hosted platform or installer"),
    ("description", "one sentence describing the product"),
    ("contact_email_address", "whom the CNCF contacts about this certification"),
)

MODE = "--conformance-mode=certify"
#: the provider of a cluster given by --kubeconfig (harness/existing.py)
EXISTING = "existing"
_ONE_RUN = f"certification runs every [Conformance] spec (focus {CONFORMANCE_FOCUS}, no skip), serially, once"
#: e2e.test flags certify sets itself: another value would move or rename junit_01.xml
OWN_E2E_FLAGS = ("report-dir", "report-prefix")


def check_options(*, smoke: bool = False, focus: str | None = None, skip: str | None = None,
                  dry_run: bool = False, parallel: int | None = None, e2e_args: Sequence[str] = (),
                  reruns: int = 0) -> None:
    """Refuse what would make a certify run differ from certification's;
    raises one SpecError naming every such option, its value and what is
    allowed.  ``parallel`` is --e2e-parallel when given on the command line."""
    errors: list[SpecError] = []
    if smoke:
        errors.append(SpecError("--conformance-smoke", True, f"not with {MODE}: {_ONE_RUN}"))
    if focus:
        errors.append(SpecError("--conformance-focus", focus, f"none with {MODE}: {_ONE_RUN}"))
    if skip:
        errors.append(SpecError("--conformance-skip", skip, f"none with {MODE}: {_ONE_RUN}"))
    if dry_run:
        errors.append(SpecError("--e2e-dry-run", True, f"not with {MODE}: a dry run certifies nothing"))
    if parallel is not None and parallel != 1:
        errors.append(SpecError("--e2e-parallel", parallel, f"1 with {MODE}: {_ONE_RUN}, in one ginkgo process"))
    for arg in e2e_args:
        flag = arg.lstrip("-").split("=", 1)[0]
        if flag.startswith("ginkgo."):
            errors.append(SpecError("--e2e-arg", arg, f"e2e.test's own flags with {MODE}, not ginkgo's: "
                                                      f"{_ONE_RUN}, with no flake attempts"))
        elif flag in OWN_E2E_FLAGS:
            errors.append(SpecError("--e2e-arg", arg, f"flags other than --{' and --'.join(OWN_E2E_FLAGS)} with "
                                                      f"{MODE}: it writes junit_01.xml to "
                                                      "$ARTIFACTS/conformance/certify"))
    if reruns:
        errors.append(SpecError("--reruns", reruns, f"0 with {MODE}: no retries, each spec's one attempt counts"))
    if errors:
        raise SpecError.of(errors)


# ------------------------------------------------------------------ facts

@dataclass
class Facts:
    """What the skeletons say about the run; "" where not known."""
    kubernetes: str                  # the version the cluster was made with
    server: str = ""                 # the API server's gitVersion
    e2e: str = ""                    # e2e.test --version
    e2e_path: str = ""
    harness: str = __version__
    harness_commit: str = ""
    provider: str = ""
    nodes: list[dict] = field(default_factory=list)  # name, roles, os, kernel, runtime, kubelet, arch
    spec_yaml: str = ""              # the kube-harness cluster spec
    kubeconfig: str = ""             # a cluster the harness did not make (--kubeconfig)

    @property
    def minor(self) -> str:
        """v1.37 of v1.37.2: the submission's directory."""
        return ".".join(self.kubernetes.split(".")[:2])


def e2e_version(e2e: Path) -> str:
    try:
        out = subprocess.run([str(e2e), "--version"], capture_output=True, text=True, timeout=60)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def gather(cluster, e2e: Path) -> Facts:
    """Facts from the cluster's API (version, each Node's nodeInfo), the spec
    and the e2e.test binary; whatever cannot be read stays ""."""
    from .metadata import harness_commit
    spec = cluster.spec
    facts = Facts(spec.version, e2e=e2e_version(e2e), e2e_path=str(e2e), harness_commit=harness_commit(),
                  provider=str(spec.provider))
    if spec.provider == EXISTING:  # read from the cluster, not what made it
        facts.kubeconfig = str(spec.source or cluster.kubeconfig_path)
    else:
        facts.spec_yaml = yaml.safe_dump(spec.to_dict(), sort_keys=False)
    try:
        from kubernetes import client
        facts.server = client.VersionApi(cluster.api_client()).get_code().git_version
        for n in cluster.core.list_node().items:
            info = n.status.node_info
            roles = sorted(k.split("/", 1)[1] for k in (n.metadata.labels or {})
                           if k.startswith("node-role.kubernetes.io/")) or ["worker"]
            facts.nodes.append({"name": n.metadata.name, "roles": ",".join(roles), "os": info.os_image,
                                "kernel": info.kernel_version, "runtime": info.container_runtime_version,
                                "kubelet": info.kubelet_version, "arch": info.architecture})
    except Exception:  # an unreachable API: the skeletons say "unknown"
        pass
    return facts


# -------------------------------------------------------------- skeletons

def _distinct(nodes: list[dict], key: str) -> str:
    return ", ".join(dict.fromkeys(n[key] for n in nodes if n.get(key))) or "unknown"


def product_yaml(facts: Facts, selftest: str | None = None) -> str:
    """PRODUCT.yaml: every field a TODO for the vendor, the run's versions in
    the comments (the file has no field for them)."""
    head = []
    if selftest:
        head.append(f"# {NOT_A_CERTIFICATION}: a kube-harness self-test of certify mode, focus narrowed to "
                    f"'{selftest}'; never submit this.")
    head += [f"# cncf/k8s-conformance submission {facts.minor}/<product>/: replace every {TODO} "
             "(https://github.com/cncf/k8s-conformance/blob/master/instructions.md#productyaml).",
             f"# Tested: Kubernetes {facts.kubernetes} (API server {facts.server or 'unknown'}), "
             f"e2e.test {facts.e2e or 'unknown'}, kube-harness {facts.harness}"
             f"{' (' + facts.harness_commit + ')' if facts.harness_commit else ''}.",
             f"# Nodes: {_distinct(facts.nodes, 'os')}; runtime {_distinct(facts.nodes, 'runtime')}."]
    doc = {k: f"{TODO}: {hint}" for k, hint in PRODUCT_FIELDS}
    if selftest:
        doc["description"] = f"{NOT_A_CERTIFICATION}: kube-harness self-test output, not a product."
    return "\n".join(head) + "\n" + yaml.safe_dump(doc, sort_keys=False, width=1000)


def readme(facts: Facts, run: PhaseResult, selftest: str | None = None) -> str:
    """README.md: how the cluster was made and the tests were run, the
    versions and the result; TODO where the vendor describes the product."""
    from .e2e_runner import _fmt, _q
    c = counts(run.results)
    failed = [r for r in run.results if r.outcome == "failed"]
    lines = [f"# Conformance results for {facts.minor}/{TODO}: product name", ""]
    if selftest:
        lines += [f"> **{NOT_A_CERTIFICATION}.** A kube-harness self-test of certify mode: "
                  f"`{CERTIFY_SELFTEST_ENV}='{selftest}'` narrowed the focus to "
                  f"{len(run.results)} spec(s). Never submit this directory.", ""]
    verdict = ("all passed" if not failed and c["passed"] and not run.not_run
               else f"{len(failed)} failed" + (f", {run.not_run} did not run" if run.not_run else "")
               + ": this run cannot be submitted")
    lines += ["## Result", "",
              f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped ({verdict}); "
              f"e2e exit {run.returncode} after {_fmt(run.seconds)}.", ""]
    lines += [f"- {r.name}" for r in failed] + ([""] if failed else [])
    lines += ["## Versions", "",
              f"- Kubernetes: {facts.kubernetes} (the API server reports {facts.server or 'unknown'})",
              f"- e2e.test: {facts.e2e or 'unknown'} ({facts.e2e_path or 'unknown path'})",
              f"- kube-harness: {facts.harness}{', commit ' + facts.harness_commit if facts.harness_commit else ''}",
              f"- cluster provider: {facts.provider or 'unknown'}", ""]
    if facts.nodes:
        lines += ["| node | roles | OS | kernel | container runtime | kubelet | arch |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {n['name']} | {n['roles']} | {n['os']} | {n['kernel']} | {n['runtime']} | {n['kubelet']} | "
                  f"{n['arch']} |" for n in facts.nodes]
    else:
        lines.append("Nodes: unknown (the API did not answer when the results were written).")
    lines += ["", "## Install the product and create the cluster", "",
              f"{TODO}: how to install the product and create the cluster that was tested. The CNCF asks for "
              "the installation and configuration steps here, not only a link to them.", ""]
    if facts.kubeconfig:
        lines += ["kube-harness did not make the tested cluster: it was given by its kubeconfig "
                  "(`--kubeconfig`).", ""]
        how = "--kubeconfig FILE"
    else:
        how = "[--cluster-config FILE]"
    if facts.spec_yaml:
        lines += ["The tested cluster was made by kube-harness from this spec "
                  "(`python3 -m pytest ... --cluster-config FILE`):", "", "```yaml", facts.spec_yaml.rstrip(),
                  "```", ""]
    lines += ["## Run the conformance tests", "",
              "```sh", f"python3 -m pytest suites/conformance --conformance-mode=certify {how}",
              "```", "",
              "It runs every `[Conformance]` spec serially, once, with no skip, as the conformance image does for "
              "`sonobuoy run --mode=certified-conformance` and `hydrophone --conformance`; the command was:", "",
              "```sh", " ".join(_q(a) for a in run.command) or "unknown", "```", "",
              "The e2e test images were built by kube-harness (`harness/build/e2eimages.py`, from the release's "
              "image manifest) and named to e2e.test with `KUBE_TEST_REPO_LIST`; they were not pulled from "
              f"registry.k8s.io. {TODO}: say how the images were provided if you ran otherwise.", "",
              "## Files", "",
              "- `e2e.log`: the run's output (ginkgo and e2e.test)",
              "- `junit_01.xml`: the e2e framework's JUnit report (`--report-dir`)",
              f"- `PRODUCT.yaml`: the product ({TODO}: fill in every field)",
              "- `README.md`: this file", "",
              f"Submit them as `{facts.minor}/<product>/` in a pull request to "
              "https://github.com/cncf/k8s-conformance titled "
              f"`Conformance results for {facts.minor}/<product>`.", ""]
    return "\n".join(lines)


def clear(directory: Path) -> Path:
    """An empty submission directory (a stale README.md or PRODUCT.yaml of an
    earlier run must not describe this one)."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    return directory


def write_submission(run: PhaseResult, facts: Facts, selftest: str | None = None) -> Path:
    """PRODUCT.yaml and README.md beside the run's e2e.log and junit_01.xml."""
    d = run.log_path.parent
    (d / "PRODUCT.yaml").write_text(product_yaml(facts, selftest))
    (d / "README.md").write_text(readme(facts, run, selftest))
    return d
