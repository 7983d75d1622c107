"""Polling helpers with messages that say what was still wrong."""
from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    pass


def until(check: Callable[[], T], timeout: float, what: str, interval: float = 2.0) -> T:
    """Call ``check`` until it returns a truthy value; its last exception or
    falsy value is reported on timeout."""
    end = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            v = check()
            if v:
                return v
            last = v
        except Exception as e:  # transient API errors while components restart
            last = f"{type(e).__name__}: {str(e)[:300]}"
        if time.monotonic() > end:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}; last: {last}")
        time.sleep(interval)


def node_ready(node) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))


def nodes_state(cluster) -> dict[str, bool]:
    return {n.metadata.name: node_ready(n) for n in cluster.core.list_node().items}
