"""The upstream Kubernetes conformance suite (e2e.test) against the
session's kubeadm cluster.  See conftest.py for the options."""
from __future__ import annotations

import pytest

from harness import conformance
from harness.progress import log

pytestmark = [pytest.mark.conformance, pytest.mark.cluster, pytest.mark.slow]


def test_conformance(cluster, request):
    cfg = request.config
    mode = conformance.conformance_mode(cfg)
    # its progress lines reach the log as the suite runs (harness.progress writes them past pytest's capture)
    run = conformance.run_conformance(
        cluster, mode=mode, focus=cfg.getoption("conformance_focus"), skip=cfg.getoption("conformance_skip"),
        nodes=conformance.e2e_parallel(cfg), timeout=cfg.getoption("e2e_timeout"),
        e2e=cfg.getoption("e2e_binary"), dry_run=cfg.getoption("e2e_dry_run"),
        extra_args=cfg.getoption("e2e_arg"))
    request.node._kh_e2e_specs = ("conformance", run.results)  # the plugin reports each spec
    cluster.timings.update({f"conformance:{k}": v for k, v in run.timings.items()})
    for k, v in run.timings.items():
        request.node.user_properties.append((f"seconds.{k}", v))
    log.info(f"{run.summary()} ({mode}; JUnit {run.prow_junit})"
             + (f"; cncf/k8s-conformance files in {run.submission}" if run.submission else ""))
    terminal = cfg.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None:
        terminal.write_line("")
        terminal.write_line(run.summary())
    ran = [r for r in run.results if r.node_type == "It"]
    assert ran or cfg.getoption("conformance_focus"), f"no e2e spec ran ({mode}); see {run.out_dir}"
    not_run = sum(p.not_run for p in run.phases)
    if run.failed:
        lines = [f"{len(run.failed)} conformance spec(s) failed ({run.summary()}"
                 f"{f'; {not_run} selected specs did not run' if not_run else ''}):"]
        lines += [f"  - {r.name}: {r.message.splitlines()[0][:300] if r.message else r.state}"
                  for r in run.failed]
        lines.append(f"logs: {run.out_dir}")
        pytest.fail("\n".join(lines), pytrace=False)
