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
* :class:`E2ERunner`: runs a phase, streams its output line by line to
  ``$ARTIFACTS/conformance/<phase>/e2e.log`` and progress (specs done /
  total, elapsed) to the ``harness.conformance`` logger.
* :func:`parse_junit` -> :class:`SpecResult` list, :func:`write_prow_junit`
  (``$ARTIFACTS/junit_conformance_e2e.xml``), :func:`summary`.
"""
from __future__ import annotations

import logging
import os
import re
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

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


# ------------------------------------------------------------------ phases

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


# ----------------------------------------------------------------- results

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


# ------------------------------------------------------------------ stream

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
