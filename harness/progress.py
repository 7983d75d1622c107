"""Structured logs and terminal progress (phase, machine, elapsed).

Progress lines go to the process's real stderr even while pytest captures
output (the plugin hands over pytest's capture manager, and each line is
written with capturing suspended, as pytest's live logging does), so they
show in a CI log as they happen. Every record also goes as one JSON object a
line to $ARTIFACTS/harness.jsonl.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

log = logging.getLogger("harness")
_START = time.monotonic()
_configured = False
_lock = threading.Lock()
_capture_manager = None  # pytest's, while a session runs


def use_capture_manager(capman) -> None:
    """Write progress past pytest's output capturing (None: directly)."""
    global _capture_manager
    _capture_manager = capman


class ProgressHandler(logging.StreamHandler):
    """stderr, with pytest's capturing suspended for the write."""

    def emit(self, record: logging.LogRecord) -> None:
        capman = _capture_manager
        if capman is None:
            return super().emit(record)
        with capman.global_and_fixture_disabled():
            super().emit(record)


class JsonFormatter(logging.Formatter):
    FIELDS = ("phase", "machine", "cluster", "elapsed", "event", "worker")

    def format(self, rec: logging.LogRecord) -> str:
        out = {"ts": round(rec.created, 3), "level": rec.levelname.lower(), "logger": rec.name,
               "msg": rec.getMessage()}
        for f in self.FIELDS:
            if hasattr(rec, f):
                out[f] = getattr(rec, f)
        if rec.exc_info:
            out["exc"] = self.formatException(rec.exc_info)
        return json.dumps(out, default=str)


class TerminalFormatter(logging.Formatter):
    def format(self, rec: logging.LogRecord) -> str:
        parts = [f"[{time.monotonic() - _START:7.1f}s]"]
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        if worker:
            parts.append(worker)
        for f in ("cluster", "phase", "machine"):
            v = getattr(rec, f, None)
            if v:
                parts.append(f"{f}={v}")
        parts.append(rec.getMessage())
        return "kube-harness " + " ".join(parts)


def artifacts_dir() -> Path:
    return Path(os.environ.get("ARTIFACTS") or "_artifacts").absolute()


def configure(verbose: bool = True, json_path: Path | None = None) -> None:
    """Install the terminal and JSON handlers once per process."""
    global _configured
    with _lock:
        if _configured:
            return
        _configured = True
        root = logging.getLogger("harness")
        root.setLevel(logging.DEBUG)
        root.propagate = False
        term = ProgressHandler(sys.__stderr__)
        term.setLevel(logging.INFO if verbose else logging.WARNING)
        term.setFormatter(TerminalFormatter())
        root.addHandler(term)
        path = json_path or artifacts_dir() / f"harness{_suffix()}.jsonl"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fh = logging.FileHandler(path)
            fh.setLevel(logging.DEBUG)
            fh.setFormatter(JsonFormatter())
            root.addHandler(fh)
        except OSError:
            pass
        for name in ("harness.build", "providers"):
            lg = logging.getLogger(name)
            lg.setLevel(logging.DEBUG)
            for h in root.handlers:
                if h not in lg.handlers:
                    lg.addHandler(h)
            lg.propagate = False


def _suffix() -> str:
    w = os.environ.get("PYTEST_XDIST_WORKER")
    return f"-{w}" if w else ""


@contextlib.contextmanager
def phase(name: str, *, cluster: str = "", machine: str = "", logger: logging.Logger = log,
          timings: dict | None = None) -> Iterator[dict]:
    """Log the start and end of a phase with its elapsed time."""
    t0 = time.monotonic()
    extra = {"phase": name, "cluster": cluster, "machine": machine}
    logger.info("start", extra={**extra, "event": "start"})
    info: dict = {}
    try:
        yield info
    except BaseException as e:
        el = time.monotonic() - t0
        logger.error(f"failed after {el:.1f}s: {type(e).__name__}: {str(e)[:300]}",
                     extra={**extra, "event": "fail", "elapsed": round(el, 2)})
        raise
    el = time.monotonic() - t0
    if timings is not None:
        key = f"{name}:{machine}" if machine else name
        timings[key] = round(el, 2)
    logger.info(f"done in {el:.1f}s", extra={**extra, "event": "done", "elapsed": round(el, 2)})
