"""Options of the conformance suite and the hook that turns each e2e spec
into its own pytest result.

    python -m pytest suites/conformance                      # [Conformance], parallel + serial phases
    python -m pytest suites/conformance --conformance-smoke  # a dozen fast specs, a few minutes
    python -m pytest suites/conformance --conformance-mode=full   # one serial run
    python -m pytest suites/conformance --conformance-mode=certify  # certification: cncf/k8s-conformance files

Results: one pytest test per e2e spec that ran
(``test_conformance.py::test_conformance::<spec text>``, passed / failed with
the e2e failure message / skipped with the e2e reason), plus the umbrella
``test_conformance`` that fails listing the failed specs by name.  Prow
artifacts: ``$ARTIFACTS/junit_conformance_e2e.xml`` (the specs),
``$ARTIFACTS/conformance/<phase>/`` (e2e.log, ginkgo-junit.xml, the e2e
framework's junit_01.xml, command.txt) and ``repo-list.yaml``.  Certify mode
writes ``$ARTIFACTS/conformance/certify/`` with exactly e2e.log, junit_01.xml,
PRODUCT.yaml and README.md (harness/certify.py) and refuses the options that
would make the run differ from a certification run.

Measured on the 2-core machine, 3-node Docker cluster (v1.37.2, 2026-12-03):
cluster up ~1.5 min; loading the 13 images into 3 nodes ~40 s; smoke ~2 min
of e2e; parallel mode: 433 non-[Serial] specs on 3 ginkgo nodes ~38 min,
then the 29 [Serial] ones ~18 min, i.e. about 58 min in all.  Use
``--e2e-timeout`` above those (default 24h).
"""
from __future__ import annotations

import os

import pytest

from harness.conformance import CERTIFY_SELFTEST_ENV, DEFAULT_PARALLEL, MODES, conformance_mode


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("conformance", "upstream e2e conformance suite")
    g.addoption("--conformance-mode", choices=MODES, default=os.environ.get("KUBE_HARNESS_CONFORMANCE_MODE"),
                help="parallel (default): non-[Serial] specs on --e2e-parallel ginkgo nodes, then the [Serial] "
                     "ones alone, as Kubernetes CI runs them; full: everything in one serial run; certify: that "
                     "run as certification makes it (no focus, skip or retry options), its results in the "
                     "cncf/k8s-conformance layout under $ARTIFACTS/conformance/certify; smoke: a dozen fast specs")
    g.addoption("--conformance-smoke", action="store_true", help="same as --conformance-mode=smoke")
    g.addoption("--conformance-focus", default=None,
                help=r"ginkgo focus regex (default \[Conformance\]; the smoke list with --conformance-smoke)")
    g.addoption("--conformance-skip", default=None,
                help=r"ginkgo skip regex, added to the mode's (parallel mode skips \[Serial\] in its first phase)")
    g.addoption("--e2e-parallel", type=int, default=None,
                help=f"ginkgo nodes for the parallel phase (default $KUBE_HARNESS_E2E_PARALLEL or "
                     f"{DEFAULT_PARALLEL}; 1 = everything serially)")
    g.addoption("--e2e-timeout", default="24h", help="ginkgo suite timeout per phase (default 24h)")
    g.addoption("--e2e-binary", default=os.environ.get("KUBE_HARNESS_E2E_BINARY"),
                help="use this e2e.test instead of building it")
    g.addoption("--e2e-dry-run", action="store_true",
                help="ginkgo dry run: list and 'pass' the selected specs without running them")
    g.addoption("--e2e-arg", action="append", default=[], help="extra e2e.test argument (repeatable)")


def pytest_configure(config: pytest.Config) -> None:
    """The controller refuses what certify mode cannot take, before anything
    is made, and records the mode in $ARTIFACTS/metadata.json."""
    if hasattr(config, "workerinput") or config.option.help:
        return
    opt = config.getoption
    mode = opt("conformance_mode") or "parallel"
    if mode == "certify":
        from harness.certify import check_options
        from harness.spec import SpecError
        try:
            check_options(smoke=opt("conformance_smoke"), focus=opt("conformance_focus"),
                          skip=opt("conformance_skip"), dry_run=opt("e2e_dry_run"), parallel=opt("e2e_parallel"),
                          e2e_args=opt("e2e_arg"), reruns=getattr(config.option, "reruns", 0) or 0)
        except SpecError as e:
            raise pytest.UsageError(str(e)) from None
    from harness import metadata
    metadata.record(config, "conformance-mode", conformance_mode(config))
    if mode == "certify" and os.environ.get(CERTIFY_SELFTEST_ENV):
        metadata.record(config, "conformance-certify-selftest", "true (NOT a certification)")
