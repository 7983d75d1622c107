"""Interrupts (Ctrl-C, SIGTERM) while the harness deletes things.

Teardown is the one thing an interrupt must not cut short: a half-done
teardown leaves containers behind. :func:`deferred` holds SIGINT and SIGTERM
until the block ends (any number of them: a second Ctrl-C does not abort it),
logs that it did, and then raises KeyboardInterrupt so the run still stops.
Nested blocks leave that to the outermost, so an inner block's end does not
cut the outer one short. Outside the main thread it does nothing (only the
main thread gets signals).
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Iterator

log = logging.getLogger("harness")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


_depth = 0  # deferred blocks open in the main thread


@contextlib.contextmanager
def deferred(what: str) -> Iterator[None]:
    global _depth
    if threading.current_thread() is not threading.main_thread() or _depth:
        yield
        return
    got: list[int] = []

    def hold(signum: int, frame: object) -> None:
        got.append(signum)
        log.warning(f"{signal.Signals(signum).name} during {what}: finishing it first, then stopping",
                    extra={"phase": "interrupt"})
    before = {s: signal.signal(s, hold) for s in SIGNALS}
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        for s, h in before.items():
            signal.signal(s, h)
    if got:
        raise KeyboardInterrupt(f"{signal.Signals(got[0]).name} (held during {what})")
