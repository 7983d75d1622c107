"""JUnit for the harness's own steps (Up, Test, Down), as kubetest2 writes
junit_runner.xml, plus helpers shared with the conformance suite."""
from __future__ import annotations

import contextlib
import time
import traceback
from pathlib import Path
from typing import Iterator

from junit_xml import TestCase, TestSuite, to_xml_report_string

from .progress import artifacts_dir


class PhaseRecorder:
    def __init__(self, name: str):
        self.name = name
        self.cases: list[TestCase] = []

    def add(self, step: str, seconds: float, failed: bool = False, message: str = "") -> None:
        tc = TestCase(step, classname=f"kube-harness.{self.name}", elapsed_sec=round(seconds, 3))
        if failed:
            tc.add_failure_info(message or f"{step} failed")
        self.cases.append(tc)

    @contextlib.contextmanager
    def step(self, step: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        except BaseException as e:
            self.add(step, time.monotonic() - t0, True, "".join(traceback.format_exception_only(type(e), e)))
            self.write()
            raise
        self.add(step, time.monotonic() - t0)

    def write(self, timings: dict | None = None, root: Path | None = None) -> Path:
        props = {k: str(v) for k, v in (timings or {}).items()}
        suite = TestSuite(f"kube-harness-{self.name}", self.cases, properties=props or None)
        p = (root or artifacts_dir()) / f"junit_runner_{self.name}.xml"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(to_xml_report_string([suite]))
        return p
