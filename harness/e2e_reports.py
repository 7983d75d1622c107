"""Each spec of an e2e run reported to pytest as a test of its own (setup,
call and teardown reports under the umbrella test's node id), so the
terminal, -ra, junitxml and xdist show them like real tests."""
from __future__ import annotations

from typing import Iterable

from .e2e_results import SpecResult


def _spec_nodeid(item, r: SpecResult) -> str:
    return f"{item.nodeid}::{r.name.replace('::', ':')}"


def spec_reports(item, r: SpecResult, suite: str = "conformance") -> list:
    """setup/call/teardown TestReports for one e2e spec, shaped like a real
    test's, so the terminal, -ra summary, junitxml and xdist all take them."""
    from _pytest.reports import TestReport
    nodeid = _spec_nodeid(item, r)
    path, lineno, _ = item.location
    loc = (path, lineno, r.name)
    kw = {suite: 1, r.sig: 1, **{lb: 1 for lb in r.labels}}
    props = [("e2e.state", r.state), ("e2e.phase", r.phase)]
    if r.location:
        props.append(("e2e.location", r.location))

    def rep(when: str, outcome: str, longrepr=None, duration: float = 0.0) -> TestReport:
        return TestReport(nodeid, loc, kw, outcome, longrepr, when, sections=[], duration=duration,
                          start=0.0, stop=duration, user_properties=props)

    if r.outcome == "passed":
        call = rep("call", "passed", None, r.seconds)
    elif r.outcome == "skipped":
        call = rep("call", "skipped", (str(path), (lineno or 0) + 1, f"Skipped: {r.message or r.state}"),
                   r.seconds)
    else:
        text = f"[{r.state.upper()}] {r.name}\n{r.message}".rstrip()
        if r.detail and r.detail.strip() != r.message.strip():
            text += "\n\n" + r.detail[-6000:]
        call = rep("call", "failed", text, r.seconds)
    return [rep("setup", "passed"), call, rep("teardown", "passed")]


def emit_spec_reports(item, results: Iterable[SpecResult], suite: str = "conformance") -> int:
    """Report every e2e spec as its own pytest test (after ``item`` ran)."""
    n = 0
    ihook = item.ihook
    results = list(results)
    try:  # so the terminal's [NN%] progress counts the specs
        item.session.testscollected += len(results)
    except AttributeError:
        pass
    for r in results:
        reports = spec_reports(item, r, suite)
        nodeid, loc = reports[0].nodeid, reports[0].location
        ihook.pytest_runtest_logstart(nodeid=nodeid, location=loc)
        for rep in reports:
            ihook.pytest_runtest_logreport(report=rep)
        ihook.pytest_runtest_logfinish(nodeid=nodeid, location=loc)
        n += 1
    return n
