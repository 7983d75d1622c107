"""kubeadm's own e2e suite (k8s.io/kubernetes/test/e2e_kubeadm, what
kubeadm's CI and kinder run) against a cluster.

e2e_kubeadm.test is built from the same module as the cluster's binaries
(:mod:`harness.build.e2e`) and run by the conformance suite's runner: the
log streams to ``$ARTIFACTS/e2e_kubeadm/e2e.log`` with progress lines, each
spec becomes a result, and the Prow JUnit goes to
``$ARTIFACTS/junit_e2e_kubeadm.xml``."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from .e2e_results import SpecResult, summary, write_prow_junit
from .e2e_runner import E2ERunner, Phase, PhaseResult

log = logging.getLogger("harness.e2e_kubeadm")

SUITE = "e2e_kubeadm"
DEFAULT_FOCUS = r"\[area-kubeadm\]"
#: specs that need certificates uploaded by ``kubeadm init --upload-certs``
#: (the kubeadm-certs Secret), which Cluster API's KubeadmControlPlane does not do
COPY_CERTS = r"\[copy-certs\]"


@dataclass
class KubeadmE2ERun:
    phase: PhaseResult
    prow_junit: Path
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def results(self) -> list[SpecResult]:
        return self.phase.results

    @property
    def failed(self) -> list[SpecResult]:
        return [r for r in self.results if r.outcome == "failed"]

    def summary(self) -> str:
        return summary(self.results, SUITE)


def join_skips(*regexes: str | None) -> str:
    """One ginkgo skip regex matching any of ``regexes``."""
    given = [r for r in regexes if r]
    return "|".join(f"({r})" for r in given) if len(given) > 1 else (given[0] if given else "")


def run_e2e_kubeadm(cluster, *, focus: str | None = None, skip: str | None = None, timeout: str = "30m",
                    artifacts: Path | None = None, binary: Path | None = None) -> KubeadmE2ERun:
    """Build (or find) e2e_kubeadm.test for the cluster's version, run the
    selected specs and write the Prow JUnit."""
    from .build import e2e as builds
    from .progress import artifacts_dir

    art = Path(artifacts or artifacts_dir())
    t = time.monotonic()
    test_binary = Path(binary) if binary else builds.ensure_e2e_kubeadm(cluster.spec.version)
    timings = {"build-e2e-kubeadm": round(time.monotonic() - t, 1)}
    phase = Phase(SUITE, focus or DEFAULT_FOCUS, skip or "", nodes=1, timeout=timeout)
    runner = E2ERunner(test_binary, cluster.kubeconfig_path, art, suite=SUITE)
    result = runner.run(phase)
    timings["e2e-kubeadm"] = round(result.seconds, 1)
    junit = write_prow_junit(result.results, art / f"junit_{SUITE}.xml", suite=SUITE,
                             properties={f"seconds.{k}": v for k, v in timings.items()})
    run = KubeadmE2ERun(result, junit, timings)
    log.info(f"{run.summary()}; JUnit {junit}, log {result.log_path}", extra={"phase": SUITE, "event": "summary"})
    return run
