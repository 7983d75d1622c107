"""Lease-based leader election on ``coordination.k8s.io/v1`` Leases, with
client-go's semantics (``k8s.io/client-go/tools/leaderelection``).

* Every write is a ``replace`` carrying the ``resourceVersion`` that was
  read, so two candidates racing for an expired lease cannot both win: the
  loser gets 409 Conflict.
* A follower never trusts the holder's clock: it notes, on its *own*
  monotonic clock, when it last saw the Lease record change, and only takes
  the Lease once ``leaseDurationSeconds`` have passed since then with no
  change (or at once when the holder released it: empty holderIdentity).
* The leader renews every ``retry_period``. :meth:`is_leader` is true only
  while the last successful renew *started* less than ``renew_deadline``
  ago, and ``renew_deadline < lease_duration``, so a leader that cannot renew
  stops acting before any follower can take over. Past the deadline the
  ``on_lost`` callback runs (the controller process then exits: client-go's
  advice too, as work in flight cannot be trusted).
* :meth:`release` (on a clean exit) empties holderIdentity, so a follower
  takes over within one retry period instead of waiting out the lease.
"""
from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger("harness.capi.leader")


def _now_micro() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _ts(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=dt.timezone.utc)
        return v.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return str(v)


@dataclass(frozen=True)
class Record:
    holder: str
    lease_duration: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int
    resource_version: str


class LeaseElector:
    """One candidate for the Lease ``namespace/name``."""

    def __init__(self, api_client: Any, name: str, namespace: str, identity: str, *,
                 lease_duration: float = 15, renew_deadline: float = 10, retry_period: float = 2,
                 on_lost: Callable[[], None] | None = None):
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ValueError(f"need 0 < retry_period ({retry_period}) < renew_deadline ({renew_deadline}) "
                             f"< lease_duration ({lease_duration})")
        from kubernetes import client
        self.api = client.CoordinationV1Api(api_client)
        self.name, self.namespace, self.identity = name, namespace, identity
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.on_lost = on_lost
        self._observed: Record | None = None
        self._observed_at = 0.0  # monotonic time the record last changed
        self._renewed_at: float | None = None  # monotonic start of the last successful acquire/renew
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # --- state -------------------------------------------------------------
    def is_leader(self) -> bool:
        with self._lock:
            return (self._renewed_at is not None and not self._lost.is_set()
                    and time.monotonic() - self._renewed_at < self.renew_deadline)

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def deadline(self) -> float | None:
        """Monotonic time by which this process must have stopped acting
        (a follower may take the lease from then on)."""
        with self._lock:
            return None if self._renewed_at is None else self._renewed_at + self.lease_duration

    @property
    def holder(self) -> str | None:
        return self._observed.holder if self._observed else None

    # --- API ---------------------------------------------------------------
    def _get(self) -> tuple[Any | None, Record | None]:
        from kubernetes.client.exceptions import ApiException
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self._timeout())
        except ApiException as e:
            if e.status == 404:
                return None, None
            raise
        s = lease.spec
        rec = Record(holder=(s.holder_identity or "") if s else "",
                     lease_duration=int((s.lease_duration_seconds if s else None) or self.lease_duration),
                     acquire_time=_ts(s.acquire_time if s else None), renew_time=_ts(s.renew_time if s else None),
                     transitions=int((s.lease_transitions if s else None) or 0),
                     resource_version=lease.metadata.resource_version)
        return lease, rec

    def _body(self, rv: str | None, acquire_time: str, transitions: int, holder: str | None = None,
              duration: int | None = None) -> dict:
        now = _now_micro()
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace,
                                "labels": {"app.kubernetes.io/managed-by": "kube-harness"}}
        if rv:
            meta["resourceVersion"] = rv
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": {"holderIdentity": self.identity if holder is None else holder,
                         "leaseDurationSeconds": int(round(self.lease_duration)) if duration is None else duration,
                         "acquireTime": acquire_time, "renewTime": now, "leaseTransitions": transitions}}

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this candidate holds the Lease afterwards."""
        from kubernetes.client.exceptions import ApiException
        start = time.monotonic()
        try:
            lease, rec = self._get()
            if lease is None:
                self._wrote(self.api.create_namespaced_lease(self.namespace, self._body(None, _now_micro(), 0),
                                                            _request_timeout=self._timeout()))
                log.info(f"{self.identity}: created Lease {self.namespace}/{self.name}; leading",
                         extra={"phase": "leader-election"})
                self._won(start)
                return True
            if rec != self._observed:
                if self._observed is not None and rec.holder != self._observed.holder:
                    log.info(f"{self.identity}: Lease holder is now {rec.holder or '(none)'}",
                             extra={"phase": "leader-election"})
                self._observed, self._observed_at = rec, start
            me = rec.holder == self.identity
            if rec.holder and not me and start < self._observed_at + rec.lease_duration:
                return False  # held by another and not expired (by our clock)
            acquire = rec.acquire_time if me and self._renewed_at is not None else _now_micro()
            transitions = rec.transitions if me else rec.transitions + 1
            self._wrote(self.api.replace_namespaced_lease(self.name, self.namespace,
                                                          self._body(rec.resource_version, acquire, transitions),
                                                          _request_timeout=self._timeout()))
            if not me or self._renewed_at is None:
                log.info(f"{self.identity}: acquired Lease {self.namespace}/{self.name} "
                         f"(previous holder {rec.holder or '(none)'}); leading", extra={"phase": "leader-election"})
            self._won(start)
            return True
        except ApiException as e:
            if e.status == 409:  # someone else wrote first
                log.debug(f"{self.identity}: Lease update conflict", extra={"phase": "leader-election"})
            else:
                log.warning(f"{self.identity}: Lease {self.namespace}/{self.name}: {e.status} {e.reason}",
                            extra={"phase": "leader-election"})
            return False
        except Exception as e:  # connection errors: retried
            log.warning(f"{self.identity}: Lease {self.namespace}/{self.name}: {type(e).__name__}: {str(e)[:200]}",
                        extra={"phase": "leader-election"})
            return False

    def _timeout(self) -> float:
        """Per-request timeout: a hung request must not outlive the renew deadline."""
        return max(1.0, (self.renew_deadline - self.retry_period) / 2)

    def _wrote(self, lease: Any) -> None:
        s = lease.spec
        self._observed = Record(self.identity, int(s.lease_duration_seconds), _ts(s.acquire_time), _ts(s.renew_time),
                                int(s.lease_transitions or 0), lease.metadata.resource_version)
        self._observed_at = time.monotonic()

    def _won(self, start: float) -> None:
        with self._lock:
            self._renewed_at = start

    # --- loops -------------------------------------------------------------
    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Block until this candidate leads (True) or ``stop`` is set (False)."""
        stop = stop or self._stop
        logged = None
        while not stop.is_set():
            if self.try_acquire_or_renew():
                return True
            if self.holder != logged:
                log.info(f"{self.identity}: following; Lease {self.namespace}/{self.name} held by {self.holder}",
                         extra={"phase": "leader-election"})
                logged = self.holder
            stop.wait(self.retry_period)
        return False

    def start_renewing(self) -> None:
        """Renew in a background thread until :meth:`stop` or loss; a second
        thread declares the loss at the renew deadline even if a renew call
        hangs (a network partition), so ``on_lost`` runs in time."""
        self._thread = threading.Thread(target=self._renew_loop, name="lease-renew", daemon=True)
        self._thread.start()
        threading.Thread(target=self._watchdog, name="lease-watchdog", daemon=True).start()

    def _watchdog(self) -> None:
        while not self._stop.wait(min(0.5, self.retry_period / 2)):
            with self._lock:
                renewed = self._renewed_at
            if renewed is not None and time.monotonic() - renewed >= self.renew_deadline:
                self._lose(f"no successful renew for {self.renew_deadline:.0f}s")
                return
            if self._lost.is_set():
                return

    def _lose(self, why: str) -> None:
        with self._lock:
            if self._lost.is_set():
                return
            self._lost.set()
        log.error(f"{self.identity}: lost Lease {self.namespace}/{self.name} ({why}; holder {self.holder})",
                  extra={"phase": "leader-election"})
        if self.on_lost:
            self.on_lost()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.retry_period):
            if self._lost.is_set():
                return
            if self.try_acquire_or_renew():
                continue
            with self._lock:
                renewed = self._renewed_at
            if self._lost.is_set():
                return
            if renewed is None or time.monotonic() - renewed >= self.renew_deadline or \
                    (self._observed and self._observed.holder not in ("", self.identity)):
                self._lose(f"no renew within {self.renew_deadline:.0f}s")
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.retry_period * 2 + 5)

    def release(self) -> bool:
        """Give the Lease up (holder emptied) if this candidate still holds it."""
        self.stop()
        if self._lost.is_set() or self._renewed_at is None:
            return False
        try:
            lease, rec = self._get()
            if rec is None or rec.holder != self.identity:
                return False
            self.api.replace_namespaced_lease(self.name, self.namespace,
                                              self._body(rec.resource_version, rec.acquire_time or _now_micro(),
                                                         rec.transitions, holder="", duration=1),
                                              _request_timeout=self._timeout())
            with self._lock:
                self._renewed_at = None
            log.info(f"{self.identity}: released Lease {self.namespace}/{self.name}",
                     extra={"phase": "leader-election"})
            return True
        except Exception as e:
            log.warning(f"{self.identity}: releasing Lease failed: {e}", extra={"phase": "leader-election"})
            return False
