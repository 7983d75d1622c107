"""Running a ginkgo e2e binary (e2e.test, e2e_kubeadm.test) for one
:class:`Phase`: the command (ginkgo CLI for parallel and upstream-style runs),
its output streamed line by line to ``<out>/<phase>/e2e.log`` with progress
lines (specs done / total, elapsed, a heartbeat), and the JUnit report parsed
into a :class:`PhaseResult`."""
from __future__ import annotations

import logging
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .e2e_results import SpecResult, parse_junit, summary

log = logging.getLogger("harness.conformance")


@dataclass
class Phase:
    name: str
    focus: str
    skip: str = ""
    nodes: int = 1
    timeout: str = "24h"
    #: run as the conformance image's go-runner does (certification): the
    #: ginkgo CLI, its flags and e2e.test's, junit_01.xml from --report-dir
    upstream: bool = False

    @property
    def junit(self) -> str:
        """The JUnit report the runner parses: the e2e framework's own
        (``--report-dir``) for upstream runs, ginkgo's otherwise."""
        return "junit_01.xml" if self.upstream else "ginkgo-junit.xml"


_OUTCOME = re.compile(r"^(?P<mark>[•SP!+]+)\s*(?:\[(?P<state>[A-Z]+)!?\]\s*)?\[(?P<secs>[\d.]+) seconds\]")
_SUITE_NODE = re.compile(r"^\[(?P<node>[A-Za-z]*Suite[A-Za-z]*)\]\s+\[?(?P<state>[A-Z]+)\]?\s+\[")
_WILL_RUN = re.compile(r"Will run (\d+) of (\d+) specs")
_RAN = re.compile(r"^Ran (\d+) of (\d+) Specs in ([\d.]+) seconds")
_SUITE_HEADER = re.compile(r"^\[[A-Za-z]*Suite[A-Za-z]*\]")
_SEP = "------------------------------"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _strip_labels(s: str) -> str:
    """'text [l1, l2]' -> 'text' (ginkgo appends the spec's labels; its
    failure reports also mark the leaf: 'Secrets [It] should ...')."""
    return re.sub(r"\s\[[^\[\]]+,[^\[\]]+\]$", "", s).replace(" [It] ", " ")


def _fmt(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class ProgressTracker:
    """Follows ginkgo's verbose output: which spec runs, which finished how."""

    def __init__(self, phase: str, logger: logging.Logger = log):
        self.phase, self.log = phase, logger
        self.total = 0
        self.done = 0
        self.failed: list[str] = []
        self.states: dict[str, int] = {}
        self.current = ""
        self._after_sep = False
        self._pending: tuple[str, float] | None = None
        self._t0 = time.monotonic()
        self.last_event = time.monotonic()
        self.finished: list[tuple[str, str, float]] = []  # (name, state, secs)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def feed(self, line: str) -> None:
        s = _ANSI.sub("", line.rstrip("\n")).strip()
        if s == _SEP:
            self._after_sep = True
            return
        if not s:
            return
        after_sep, self._after_sep = self._after_sep, False
        m = _OUTCOME.match(s)
        if m:
            state = (m.group("state") or ("SKIPPED" if m.group("mark").startswith("S") else "PASSED")).lower()
            secs = float(m.group("secs"))
            if after_sep or not self.current:
                # non-streamed report (parallel runs): the spec's name follows
                self._pending = (state, secs)
            else:
                self._finish(self.current, state, secs)
            return
        if self._pending is not None:
            state, secs = self._pending
            self._pending = None
            self._finish(_strip_labels(s), state, secs)
            return
        if after_sep and s.startswith("[") and not _SUITE_HEADER.match(s):
            self.current = _strip_labels(s)  # a spec starts (streamed, serial runs)
            return
        m = _WILL_RUN.search(s)
        if m:
            self.total += int(m.group(1))
            self.log.info(f"[{self.phase}] will run {m.group(1)} of {m.group(2)} specs",
                          extra={"phase": f"conformance-{self.phase}"})
            return
        m = _SUITE_NODE.match(s)
        if m and m.group("state") != "PASSED":
            self.failed.append(f"[{m.group('node')}]")
            self.log.error(f"[{self.phase}] {m.group('node')} {m.group('state')}: {s}",
                           extra={"phase": f"conformance-{self.phase}"})
            return
        m = _RAN.match(s)
        if m:
            self.log.info(f"[{self.phase}] ran {m.group(1)} of {m.group(2)} specs in {float(m.group(3)):.0f}s",
                          extra={"phase": f"conformance-{self.phase}"})
            return
        if s.startswith(("SUCCESS!", "FAIL!")):
            self.log.info(f"[{self.phase}] {s}", extra={"phase": f"conformance-{self.phase}"})

    def _finish(self, name: str, state: str, secs: float) -> None:
        if _SUITE_HEADER.match(name):  # suite nodes are not specs
            self.current = ""
            return
        self.done += 1
        self.states[state] = self.states.get(state, 0) + 1
        self.finished.append((name, state, secs))
        if state not in ("passed", "skipped"):
            self.failed.append(name)
        total = f"/{self.total}" if self.total else ""
        self.log.info(f"[{self.phase} {self.done}{total}] {state.upper():7s} {secs:7.1f}s {name}  "
                      f"(elapsed {_fmt(self.elapsed)}, {len(self.failed)} failed)",
                      extra={"phase": f"conformance-{self.phase}", "event": "spec"})
        self.current = ""
        self.last_event = time.monotonic()

    def heartbeat(self) -> str:
        total = f"/{self.total}" if self.total else ""
        cur = f"; running: {self.current}" if self.current else ""
        return f"[{self.phase} {self.done}{total}] elapsed {_fmt(self.elapsed)}, {len(self.failed)} failed{cur}"


@dataclass
class PhaseResult:
    phase: Phase
    returncode: int
    seconds: float
    log_path: Path
    junit_path: Path
    results: list[SpecResult] = field(default_factory=list)
    error: str = ""
    not_run: int = 0  # selected specs that never ran (suite timeout, interrupt)
    command: list[str] = field(default_factory=list)


class E2ERunner:
    def __init__(self, e2e: Path, kubeconfig: Path, out_dir: Path, *, repo_list: Path | None = None,
                 ginkgo: Path | None = None, kubectl: Path | None = None, provider: str = "skeleton",
                 extra_args: Sequence[str] = (), dry_run: bool = False, heartbeat: float = 60.0,
                 env: dict | None = None, suite: str = "conformance"):
        self.suite = suite
        self.e2e, self.kubeconfig, self.out_dir = Path(e2e), Path(kubeconfig), Path(out_dir)
        self.repo_list, self.ginkgo, self.kubectl = repo_list, ginkgo, kubectl
        self.provider, self.extra_args, self.dry_run = provider, list(extra_args), dry_run
        self.heartbeat = heartbeat
        self.env = env
        self.proc: subprocess.Popen | None = None

    def command(self, phase: Phase, phase_dir: Path) -> list[str]:
        if phase.upstream:
            return self.upstream_command(phase, phase_dir)
        e2e_args = [f"--kubeconfig={self.kubeconfig}", f"--provider={self.provider}",
                    f"--report-dir={phase_dir}", "--disable-log-dump"]
        if self.kubectl:
            e2e_args.append(f"--kubectl-path={self.kubectl}")
        e2e_args += self.extra_args
        junit = phase_dir / "ginkgo-junit.xml"
        g = {"focus": phase.focus, "skip": phase.skip, "timeout": phase.timeout}
        if phase.nodes > 1 and not self.dry_run:  # ginkgo dry-runs only serially
            if not self.ginkgo:
                raise RuntimeError("parallel e2e runs need the ginkgo CLI")
            cmd = [str(self.ginkgo), f"--nodes={phase.nodes}", "--no-color", "-v", "--silence-skips",
                   f"--timeout={g['timeout']}", f"--focus={g['focus']}",
                   f"--junit-report={junit.name}", f"--output-dir={phase_dir}"]
            if g["skip"]:
                cmd.append(f"--skip={g['skip']}")
            return cmd + [str(self.e2e), "--"] + e2e_args
        cmd = [str(self.e2e), *e2e_args, f"--ginkgo.focus={g['focus']}", "--ginkgo.no-color", "--ginkgo.v",
               "--ginkgo.silence-skips", f"--ginkgo.timeout={g['timeout']}", f"--ginkgo.junit-report={junit}"]
        if g["skip"]:
            cmd.append(f"--ginkgo.skip={g['skip']}")
        if self.dry_run:
            cmd.append("--ginkgo.dry-run")
        return cmd

    def upstream_command(self, phase: Phase, phase_dir: Path) -> list[str]:
        """The command the conformance image's go-runner builds
        (test/conformance/image/go-runner/cmd.go) with certification's
        settings (E2E_FOCUS=\\[Conformance\\], E2E_SKIP empty, E2E_PARALLEL
        off): ``ginkgo --focus=... --skip= --no-color=true --timeout=24h
        e2e.test -- --disable-log-dump --provider=... --report-dir=DIR
        --kubeconfig=...``, plus ginkgo's ``-v`` as hydrophone and sonobuoy
        pass it (spec names and the e2e's own log in e2e.log).  No
        ``--procs``/``--nodes``, no ``--flake-attempts``: one process, one
        attempt.  kubectl is found on PATH, as in the image."""
        if not self.ginkgo:
            raise RuntimeError("upstream-style e2e runs need the ginkgo CLI")
        ginkgo_args = [f"--focus={phase.focus}", f"--skip={phase.skip}", "--no-color=true", "-v",
                       f"--timeout={phase.timeout}"]
        if self.dry_run:
            ginkgo_args.append("--dry-run=true")  # as E2E_DRYRUN does
        e2e_args = ["--disable-log-dump", f"--provider={self.provider}", f"--report-dir={phase_dir}",
                    f"--kubeconfig={self.kubeconfig}", *self.extra_args]
        return [str(self.ginkgo), *ginkgo_args, str(self.e2e), "--", *e2e_args]

    def run(self, phase: Phase) -> PhaseResult:
        phase_dir = self.out_dir / phase.name
        phase_dir.mkdir(parents=True, exist_ok=True)
        junit = phase_dir / phase.junit
        if junit.exists():
            junit.unlink()
        cmd = self.command(phase, phase_dir)
        env = dict(self.env or os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        if self.repo_list:
            env["KUBE_TEST_REPO_LIST"] = str(self.repo_list)
        if self.kubectl:
            env["PATH"] = f"{Path(self.kubectl).parent}{os.pathsep}{env.get('PATH', '')}"
        log_path = phase_dir / "e2e.log"
        if not phase.upstream:  # an upstream run's directory holds only what a submission does
            (phase_dir / "command.txt").write_text(" ".join(_q(c) for c in cmd) + "\n")
        tracker = ProgressTracker(phase.name)
        log.info(f"[{phase.name}] e2e: nodes={phase.nodes} focus={phase.focus!r} skip={phase.skip!r}; "
                 f"log {log_path}", extra={"phase": f"conformance-{phase.name}", "event": "start"})
        t0 = time.monotonic()
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat):
                if time.monotonic() - tracker.last_event >= self.heartbeat:
                    log.info(tracker.heartbeat(), extra={"phase": f"conformance-{phase.name}"})

        hb = threading.Thread(target=beat, daemon=True)
        with open(log_path, "w", buffering=1) as lf:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                         cwd=phase_dir, text=True, errors="replace", bufsize=1,
                                         start_new_session=True)
            hb.start()
            try:
                assert self.proc.stdout is not None
                for line in self.proc.stdout:
                    lf.write(line)
                    tracker.feed(line)
                rc = self.proc.wait()
            except BaseException:
                self.terminate()
                raise
            finally:
                stop.set()
        secs = time.monotonic() - t0
        if not junit.exists():  # the ginkgo CLI may prefix the suite name
            found = sorted(phase_dir.glob(f"*{phase.junit}"))
            junit = found[0] if found else junit
        res = PhaseResult(phase, rc, secs, log_path, junit, command=cmd)
        if junit.exists():
            res.results = parse_junit(junit, phase=phase.name)
        else:
            res.error = f"e2e exited {rc} without a JUnit report ({junit}); see {log_path}"
            res.results = [SpecResult(n, st, sec, phase=phase.name) for n, st, sec in tracker.finished]
        if rc != 0 and not any(r.outcome == "failed" for r in res.results):
            tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-40:])
            res.error = res.error or f"e2e exited {rc} with no failed spec in its report"
            res.results.append(SpecResult(f"[e2e {phase.name}] run", "failed", secs, res.error, tail,
                                          "Run", phase=phase.name))
        ran = sum(1 for r in res.results if r.node_type == "It")
        res.not_run = max(0, tracker.total - ran)
        if res.not_run:
            log.warning(f"[{phase.name}] {res.not_run} of {tracker.total} selected specs did not run "
                        f"(suite timeout {phase.timeout} or interrupted)", extra={"phase": f"conformance-{phase.name}"})
        log.info(f"[{phase.name}] {summary(res.results, self.suite)} in {_fmt(secs)} (exit {rc})",
                 extra={"phase": f"conformance-{phase.name}", "event": "done", "elapsed": round(secs, 1)})
        return res

    def terminate(self) -> None:
        p = self.proc
        if p and p.poll() is None:
            import signal
            try:
                os.killpg(p.pid, signal.SIGINT)  # ginkgo runs its cleanup and writes the report
                p.wait(timeout=120)
            except Exception:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _q(s: str) -> str:
    import shlex
    return shlex.quote(str(s))
