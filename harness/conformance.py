"""Run the upstream e2e conformance suite (e2e.test) against a cluster and
turn its ginkgo JUnit report into results.

* e2e.test and the ginkgo CLI come from :mod:`harness.build.e2e`.
* :func:`phases_for`: the runs a mode makes (``parallel``: non-[Serial]
  specs on N ginkgo nodes, then the [Serial] ones alone, as Kubernetes CI
  does; ``full``: everything in one serial run; ``certify``: that run
  exactly as the conformance image's go-runner makes it for sonobuoy's
  certified-conformance mode and hydrophone, written out in the
  cncf/k8s-conformance layout by :mod:`harness.certify`; ``smoke``: a few
  fast specs).
* :func:`run_conformance`: builds what is missing, loads and serves the
  images, runs the phases with :class:`harness.e2e_runner.E2ERunner` (output in
  ``$ARTIFACTS/conformance/<phase>/``) and writes the Prow JUnit
  ``$ARTIFACTS/junit_conformance_e2e.xml`` (:mod:`harness.e2e_results`).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from .e2e_results import SpecResult, summary, write_prow_junit
from .e2e_runner import E2ERunner, Phase, PhaseResult

log = logging.getLogger("harness.conformance")

CONFORMANCE_FOCUS = r"\[Conformance\]"
SERIAL = r"\[Serial\]"

#: quick, independent conformance specs that together touch the API server,
#: scheduler, kubelet + containerd (busybox/agnhost/httpd images), volumes,
#: controllers, CoreDNS, kube-proxy, the pod network and kubectl
SMOKE_SPECS = (
    "[sig-node] Pods should get a host IP",
    "[sig-node] ConfigMap should be consumable via environment variable",
    "[sig-node] Variable Expansion should allow composing env vars into new env vars",
    "[sig-node] Kubelet when scheduling a busybox command in a pod should print the output to logs",
    "[sig-storage] EmptyDir volumes should support (root,0644,tmpfs)",
    "[sig-storage] Downward API volume should provide podname only",
    "[sig-api-machinery] Watchers should observe add, update, and delete watch notifications on configmaps",
    "[sig-api-machinery] CustomResourceDefinition resources [Privileged:ClusterAdmin] Simple "
    "CustomResourceDefinition creating/deleting custom resource definition objects works",
    "[sig-apps] Deployment RollingUpdateDeployment should delete old pods and create new ones",
    "[sig-network] Services should serve a basic endpoint from pods",
    "[sig-network] DNS should provide DNS for the cluster",
    "[sig-network] Networking Granular Checks: Pods should function for intra-pod communication: http",
    "[sig-cli] Kubectl client Kubectl version should check is all data is printed",
    # pulls with imagePullPolicy: Always, from the in-cluster registry (harness.registry); v1.37+
    "[sig-auth] Projected PodCertificate [FeatureGate:PodCertificateRequest] [FeatureGate:ClusterTrustBundle] "
    "[FeatureGate:ClusterTrustBundleProjection] should allow server and client pods to establish an mTLS connection",
)

MODES = ("parallel", "full", "smoke", "certify")

#: For the harness's own tests only: a regex that narrows certify mode's focus
#: to a few [Conformance] specs, so its real code path runs in minutes.  The
#: output then says, in PRODUCT.yaml and README.md, that it is NOT a
#: certification.
CERTIFY_SELFTEST_ENV = "KUBE_HARNESS_CERTIFY_SELFTEST_FOCUS"

_RE2_SPECIAL = set("\\.+*?()|[]{}^$")


def re2_escape(s: str) -> str:
    """Escape for Go's regexp (RE2 rejects Python's escaped spaces)."""
    return "".join("\\" + c if c in _RE2_SPECIAL else c for c in s)


def smoke_focus(specs: Iterable[str] = SMOKE_SPECS) -> str:
    return "(" + "|".join(re2_escape(s) for s in specs) + r").*\[Conformance\]"


# ------------------------------------------------------------------ builds

def ensure_kubectl(cluster) -> Path:
    """A kubectl for e2e's kubectl tests: $KUBECTL, the built one on PATH, or
    the control-plane machine's own (same version), copied out."""
    if os.environ.get("KUBECTL"):
        return Path(os.environ["KUBECTL"])
    from .build import cache, kube
    try:
        built = kube.output_dir(cluster.spec.version) / "bin" / "kubectl"
        if cache.is_complete(built.parent.parent) and built.exists():
            return built
    except Exception:
        pass
    out = cache.cache_dir() / "e2e" / f"kubectl-{cluster.spec.version}" / "kubectl"
    if not out.exists():
        cp = cluster.control_planes[0]
        data = cluster.provider.copy_from(cp, "/usr/bin/kubectl")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name("kubectl.tmp")
        tmp.write_bytes(data)
        tmp.chmod(0o755)
        tmp.rename(out)
    return out


def certify_phase(*, timeout: str = "24h", selftest_focus: str | None = None) -> Phase:
    """Certification: every [Conformance] spec, serially, no skip.
    ``selftest_focus`` (harness self-tests only) narrows it to the matching
    [Conformance] specs."""
    focus = f"({selftest_focus}).*{CONFORMANCE_FOCUS}" if selftest_focus else CONFORMANCE_FOCUS
    return Phase("certify", focus, "", 1, timeout, upstream=True)


def phases_for(mode: str, *, focus: str | None = None, skip: str | None = None, nodes: int = 3,
               timeout: str = "24h", selftest_focus: str | None = None) -> list[Phase]:
    """The e2e runs of a mode.  ``focus``/``skip`` override the mode's regexes
    (not certify's: that one runs every [Conformance] spec)."""
    if mode not in MODES:
        raise ValueError(f"conformance mode {mode!r}; one of {MODES}")
    if mode == "certify":
        if focus or skip:
            raise ValueError(f"certify mode takes no focus or skip (got focus={focus!r}, skip={skip!r})")
        return [certify_phase(timeout=timeout, selftest_focus=selftest_focus)]
    user_skip = skip or ""
    join = lambda *xs: "|".join(dict.fromkeys(x for x in xs if x))  # noqa: E731
    if mode == "smoke":
        return [Phase("smoke", focus or smoke_focus(), user_skip, max(1, min(nodes, 2)), timeout)]
    f = focus or CONFORMANCE_FOCUS
    if mode == "full" or nodes <= 1:
        return [Phase("conformance", f, user_skip, 1, timeout)]
    return [Phase("parallel", f, join(SERIAL, user_skip), nodes, timeout),
            Phase("serial", f"{SERIAL}.*{f}|{f}.*{SERIAL}", user_skip, 1, timeout)]


@dataclass
class ConformanceRun:
    mode: str
    phases: list[PhaseResult]
    out_dir: Path
    prow_junit: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)
    submission: Path | None = None  # certify: the cncf/k8s-conformance directory

    @property
    def results(self) -> list[SpecResult]:
        return [r for p in self.phases for r in p.results]

    @property
    def failed(self) -> list[SpecResult]:
        return [r for r in self.results if r.outcome == "failed"]

    def summary(self) -> str:
        return summary(self.results)


def run_conformance(cluster, *, mode: str = "parallel", focus: str | None = None, skip: str | None = None,
                    nodes: int = 3, timeout: str = "24h", artifacts: Path | None = None,
                    e2e: Path | None = None, images: Sequence[str] | None = None, load: bool = True,
                    dry_run: bool = False, extra_args: Sequence[str] = ()) -> ConformanceRun:
    """Build what is missing (e2e.test, ginkgo, images), load the images into
    the nodes, run the mode's phases, write Prow JUnit and return results."""
    from . import registry
    from .build import e2e as builds, e2eimages
    from .images_load import load_images
    from .progress import artifacts_dir

    art = Path(artifacts or artifacts_dir())
    out_dir = art / "conformance"
    out_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    selftest = (os.environ.get(CERTIFY_SELFTEST_ENV) or None) if mode == "certify" else None
    if selftest:
        log.warning(f"${CERTIFY_SELFTEST_ENV}={selftest!r}: certify mode narrowed to the matching specs for the "
                    "harness's own tests; the results are NOT a certification", extra={"phase": "conformance"})
    phases = phases_for(mode, focus=focus, skip=skip, nodes=nodes, timeout=timeout, selftest_focus=selftest)
    if mode == "certify":
        from . import certify
        certify.clear(out_dir / phases[0].name)

    t = time.monotonic()
    e2e_bin = Path(e2e) if e2e else builds.ensure_e2e(getattr(cluster.spec, "version", None))
    ginkgo = builds.ensure_ginkgo() if any(p.nodes > 1 or p.upstream for p in phases) else None
    timings["build-e2e"] = round(time.monotonic() - t, 1)

    t = time.monotonic()
    wanted = tuple(images) if images else (e2eimages.SMOKE_IMAGES if mode == "smoke"
                                           else e2eimages.CONFORMANCE_IMAGES)
    tags = e2eimages.build_e2e_images(getattr(cluster.spec, "version", None), wanted)
    repo_list = e2eimages.write_repo_list(out_dir / "repo-list.yaml")
    timings["build-images"] = round(time.monotonic() - t, 1)

    if load and not dry_run:
        t = time.monotonic()
        load_images(cluster, tags.values())
        timings["load-images"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        registry.serve(cluster, tags.values(), e2eimages.REGISTRY)  # for imagePullPolicy: Always
        timings["registry"] = round(time.monotonic() - t, 1)

    kubectl = ensure_kubectl(cluster)
    runner = E2ERunner(e2e_bin, cluster.kubeconfig_path, out_dir, repo_list=repo_list, ginkgo=ginkgo,
                       kubectl=kubectl, dry_run=dry_run, extra_args=extra_args)
    done: list[PhaseResult] = []
    for ph in phases:
        t = time.monotonic()
        done.append(runner.run(ph))
        timings[f"e2e-{ph.name}"] = round(time.monotonic() - t, 1)
    run = ConformanceRun(mode, done, out_dir, timings=timings)
    if mode == "certify":
        run.submission = certify.write_submission(done[0], certify.gather(cluster, e2e_bin), selftest)
        log.info(f"submission files in {run.submission}" + (" (NOT a certification: self-test)" if selftest else ""),
                 extra={"phase": "conformance"})
    run.prow_junit = write_prow_junit(run.results, art / "junit_conformance_e2e.xml",
                                      properties={"mode": mode, **{f"seconds.{k}": v for k, v in timings.items()}})
    log.info(run.summary(), extra={"phase": "conformance", "event": "summary"})
    return run


# ------------------------------------------------------------------ pytest

DEFAULT_PARALLEL = 3


def conformance_mode(config) -> str:
    """The mode the suite's options ask for (suites/conformance/conftest.py)."""
    return "smoke" if config.getoption("conformance_smoke") else config.getoption("conformance_mode") or "parallel"


def e2e_parallel(config) -> int:
    """--e2e-parallel, else $KUBE_HARNESS_E2E_PARALLEL, else 3."""
    given = config.getoption("e2e_parallel")
    return given if given is not None else int(os.environ.get("KUBE_HARNESS_E2E_PARALLEL", DEFAULT_PARALLEL))
