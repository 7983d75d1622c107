"""Results of an e2e run (e2e.test, e2e_kubeadm.test): the ginkgo / e2e
framework JUnit report parsed into :class:`SpecResult` s, counted and
summarised, and written again as Prow/testgrid JUnit (junit-xml)."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence


@dataclass
class SpecResult:
    name: str          # full spec text, e.g. "[sig-node] Pods should get a host IP [NodeConformance] [Conformance]"
    state: str         # ginkgo state: passed, failed, skipped, pending, panicked, timedout, interrupted, aborted
    seconds: float = 0.0
    message: str = ""
    detail: str = ""
    node_type: str = "It"
    labels: tuple[str, ...] = ()
    phase: str = ""

    @property
    def outcome(self) -> str:
        """pytest's view: passed, failed or skipped."""
        if self.state == "passed":
            return "passed"
        if self.state in ("skipped", "pending"):
            return "skipped"
        return "failed"

    @property
    def sig(self) -> str:
        m = re.match(r"\[(sig-[\w-]+)\]", self.name)
        return m.group(1) if m else "e2e"

    @property
    def location(self) -> str:
        """Where it failed (ginkgo's 'In [It] at: file:line'), else the first
        source location in the detail."""
        m = re.search(r"In \[[^\]]+\] at: (\S+\.go:\d+)", self.detail) or \
            re.search(r"(k8s\.io/kubernetes@[^\s:]+\.go:\d+)", self.detail)
        return m.group(1) if m else ""


_LEAF = re.compile(r"^\[(It|BeforeSuite|AfterSuite|SynchronizedBeforeSuite|SynchronizedAfterSuite|"
                   r"ReportBeforeSuite|ReportAfterSuite|DeferCleanup \(Suite\))\]\s*")


def _split_name(raw: str) -> tuple[str, str, tuple[str, ...]]:
    """'[It] text [l1, l2]' -> ('It', 'text', ('l1', 'l2'))."""
    node_type = "It"
    m = _LEAF.match(raw)
    if m:
        node_type, raw = m.group(1), raw[m.end():]
    labels: tuple[str, ...] = ()
    lm = re.search(r"\s\[([^\[\]]+)\]$", raw)
    if lm:
        items = tuple(x.strip() for x in lm.group(1).split(","))
        text = raw[:lm.start()]
        # a label group has several items, or repeats a [Tag] of the text
        if len(items) > 1 or f"[{items[0]}]" in text:
            raw, labels = text, items
    return node_type, raw.strip(), labels


def _message_from(text: str) -> str:
    """The failure message of a report whose message attribute is empty (the
    e2e framework's): '[FAILED] msg...\\nIn [It] at: file:line' -> 'msg...'."""
    text = re.sub(r"^\[[A-Z]+\]\s*", "", text.strip())
    return re.split(r"\n\s*In \[[^\]]+\] at: ", text, maxsplit=1)[0].strip()


def parse_junit(path: Path | str, *, include_not_run: bool = False, phase: str = "") -> list[SpecResult]:
    """Specs from a ginkgo JUnit report.  Specs the focus/skip filter left
    out (``<skipped message="skipped"/>``) are dropped unless asked for;
    suite nodes (BeforeSuite...) are kept only when they did not pass."""
    root = ET.parse(str(path)).getroot()
    out: list[SpecResult] = []
    for tc in root.iter("testcase"):
        node_type, name, labels = _split_name(tc.get("name", ""))
        state = (tc.get("status") or "").lower()
        fail = tc.find("failure")
        err = tc.find("error")
        skipped = tc.find("skipped")
        if not state:
            state = "failed" if fail is not None else "panicked" if err is not None else \
                "skipped" if skipped is not None else "passed"
        message, detail = "", ""
        if skipped is not None:
            message = skipped.get("message", "")
            if message == "skipped" and not include_not_run and state == "skipped":
                continue  # filtered out, never ran
            message = re.sub(r"^skipped - ", "", message)
        for el in (fail, err):
            if el is not None:
                detail = (el.text or "").strip() or detail
                message = el.get("message", "") or _message_from(detail) or message
        if node_type != "It" and state == "passed":
            continue
        sysout = tc.find("system-err")
        if sysout is None:
            sysout = tc.find("system-out")
        if state not in ("passed", "skipped") and sysout is not None and sysout.text:
            detail = (detail + "\n\n" + sysout.text.strip()).strip()
        if node_type != "It":
            name = f"[{node_type}] {name}".strip()
        out.append(SpecResult(name, state, float(tc.get("time") or 0), message.strip(), detail, node_type,
                              labels, phase))
    return out


def counts(results: Iterable[SpecResult]) -> dict[str, int]:
    c = {"passed": 0, "failed": 0, "skipped": 0}
    for r in results:
        c[r.outcome] += 1
    return c


def summary(results: Sequence[SpecResult], suite: str = "conformance") -> str:
    c = counts(results)
    return f"{suite}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"


def write_prow_junit(results: Sequence[SpecResult], path: Path, suite: str = "conformance",
                     properties: dict | None = None) -> Path:
    """Re-emit the specs as Prow/testgrid JUnit (junit-xml package)."""
    from junit_xml import TestCase, TestSuite, to_xml_report_string
    cases = []
    for r in results:
        tc = TestCase(r.name, classname=f"{suite}.{r.sig}", elapsed_sec=round(r.seconds, 3))
        if r.outcome == "failed":
            if r.state in ("failed",):
                tc.add_failure_info(r.message or r.state, r.detail or None, failure_type=r.state)
            else:
                tc.add_error_info(r.message or r.state, r.detail or None, error_type=r.state)
        elif r.outcome == "skipped":
            tc.add_skipped_info(r.message or r.state)
        cases.append(tc)
    ts = TestSuite(suite, cases, properties={k: str(v) for k, v in (properties or {}).items()} or None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_xml_report_string([ts]))
    return path
