"""The machine-controller interface a provider author implements: small capability
protocols (:class:`Machines`, :class:`Provisioning`, :class:`Exec`, :class:`LoadBalancer`,
:class:`Cleanup`, :class:`NodeImages`, :class:`HostLimits`), of which a provider implements
those it has, and :class:`MachineProvider`, a convenient base class.

Objects are shaped like Cluster API's: a Machine belongs to a Cluster (by
name, in a namespace) and to a MachineDeployment, and has a role. Every
object a provider creates carries the labels from ``owner_labels`` so that
cleanup and the reaper find it without any state file.
"""
from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol, Sequence, runtime_checkable

LABEL_PREFIX = "harness.k8s.io"
L_CLUSTER = f"{LABEL_PREFIX}/cluster"
L_NAMESPACE = f"{LABEL_PREFIX}/namespace"
L_ROLE = f"{LABEL_PREFIX}/role"
L_DEPLOYMENT = f"{LABEL_PREFIX}/machine-deployment"
L_RUN = f"{LABEL_PREFIX}/run-id"
L_OWNER_PID = f"{LABEL_PREFIX}/owner-pid"
L_OWNER_HOST = f"{LABEL_PREFIX}/owner-host"
L_OWNER_START = f"{LABEL_PREFIX}/owner-start"
L_KEEP = f"{LABEL_PREFIX}/keep"

ROLES = ("control-plane", "worker", "load-balancer")


class ProviderError(RuntimeError):
    """A provider operation failed."""


class OptionError(ValueError):
    """A provider option has a bad value; ``field`` is its path under the options."""

    def __init__(self, field: str, value: Any, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"invalid option {field}: {value!r}; allowed: {allowed}")


class ExecError(ProviderError):
    def __init__(self, machine: str, cmd: Sequence[str], result: "ExecResult"):
        self.machine, self.cmd, self.result = machine, list(cmd), result
        tail = (result.stderr or result.stdout).strip()[-2000:]
        super().__init__(f"{machine}: {' '.join(cmd)!s} exited {result.exit_code}: {tail}")


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class Owner:
    """Who made an object: the run, its process and host (for the reaper)."""
    run_id: str
    pid: int
    host: str
    started: int = 0  # owner process create time (epoch s), guards against pid reuse
    keep: bool = False

    def labels(self) -> dict[str, str]:
        return {L_RUN: self.run_id, L_OWNER_PID: str(self.pid), L_OWNER_HOST: self.host,
                L_OWNER_START: str(self.started), L_KEEP: "true" if self.keep else "false"}


@dataclass(frozen=True)
class MachineSpec:
    """What to create: the provider turns this into a running machine."""
    name: str
    cluster: str
    namespace: str
    role: str
    deployment: str
    image: str
    owner: Owner
    labels: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    def all_labels(self) -> dict[str, str]:
        return {**self.labels, **owner_labels(self.cluster, self.namespace, self.owner),
                L_ROLE: self.role, L_DEPLOYMENT: self.deployment}


@dataclass(frozen=True)
class Machine:
    """A machine as the provider sees it now."""
    name: str
    cluster: str
    namespace: str
    role: str
    deployment: str
    provider_id: str
    state: str  # running, stopped, missing...
    addresses: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def ip(self) -> str:
        return self.addresses[0] if self.addresses else ""

    def address(self, family: int) -> str:
        """The first address of IP family 4 or 6 ("" when it has none)."""
        return next((a for a in self.addresses if (":" in a) == (family == 6)), "")

    def replace(self, **kw: Any) -> "Machine":
        return dataclasses.replace(self, **kw)


@dataclass(frozen=True)
class Health:
    running: bool
    booted: bool  # init system reached a running state
    detail: str = ""


def owner_labels(cluster: str, namespace: str, owner: Owner) -> dict[str, str]:
    return {L_CLUSTER: cluster, L_NAMESPACE: namespace, **owner.labels()}


# --- capabilities: what a provider can do, each checked with isinstance(provider, Capability)

@runtime_checkable
class Machines(Protocol):
    """See and power the machines: list and inspect them, their health, stop and start them,
    and where the harness host reaches one of their ports."""

    def list_machines(self, cluster: str | None = None, namespace: str | None = None,
                      selector: Mapping[str, str] | None = None) -> list[Machine]: ...

    def get_machine(self, name: str) -> Machine | None: ...

    def health(self, machine: Machine) -> Health: ...

    def stop_machine(self, machine: Machine) -> None: ...

    def start_machine(self, machine: Machine) -> Machine: ...

    def host_endpoint(self, machine: Machine, port: int) -> tuple[str, int]:
        """Where the harness host reaches ``port`` of the machine."""


@runtime_checkable
class Provisioning(Protocol):
    """Make and delete machines, and the infrastructure a cluster's machines share (its network)."""

    def ensure_infrastructure(self, cluster: str, namespace: str, owner: Owner,
                              ip_families: Sequence[int] = (4,)) -> None:
        """Make what the cluster's machines share (network); ``ip_families``
        (4 and/or 6) are the families its machines need addresses of."""

    def delete_infrastructure(self, cluster: str, namespace: str) -> None: ...

    def create_machine(self, spec: MachineSpec) -> Machine: ...

    def delete_machine(self, machine: Machine) -> None: ...

    def wait_booted(self, machine: Machine, timeout: float = 120) -> None: ...


@runtime_checkable
class Exec(Protocol):
    """Run commands in machines, copy files in and out, read their logs."""

    def exec(self, machine: Machine, cmd: Sequence[str], *, input: bytes | None = None,
             check: bool = True, timeout: float | None = None,
             env: Mapping[str, str] | None = None) -> ExecResult: ...

    def copy_to(self, machine: Machine, dest: str, data: bytes, mode: int = 0o644) -> None: ...

    def copy_from(self, machine: Machine, src: str) -> bytes: ...

    def logs(self, machine: Machine) -> str:
        """The machine's console/container log."""

    def collect_artifacts(self, machine: Machine, dest_dir: str) -> list[str]:
        """Write the machine's logs into dest_dir; returns files written. Never raises."""


@runtime_checkable
class LoadBalancer(Protocol):
    """The cluster's API load balancer (needed for more than one control plane)."""

    def ensure_load_balancer(self, cluster: str, namespace: str, owner: Owner,
                             backends: Sequence[tuple[str, str]], port: int = 6443) -> Machine:
        """Create or reconfigure the load balancer so it forwards ``port`` to the
        ``(name, address)`` backends; it is listed with role ``load-balancer``."""


@runtime_checkable
class Cleanup(Protocol):
    """Find and delete everything the provider made, by labels (teardown, reaper)."""

    def list_owned(self, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        """Every object (machine, network, volume) matching the label selector,
        as dicts with at least kind, name and labels."""

    def delete_owned(self, selector: Mapping[str, str]) -> list[str]:
        """Delete every object matching the selector; returns what was deleted."""


@runtime_checkable
class NodeImages(Protocol):
    """The images machines boot from."""

    def node_image(self, version: str | None, **options: Any) -> str:
        """The image machines of this Kubernetes version boot from (None: machines only, no
        Kubernetes); the provider option ``image``, when given, names a prebuilt one."""

    def node_image_problem(self, image: str) -> str | None:
        """Why a prebuilt image the user named cannot boot this provider's machines
        (what would be allowed), or None."""


@runtime_checkable
class HostLimits(Protocol):
    """Machines share the harness host's kernel: the provider warns about its limits."""

    def check_host_limits(self, cluster: str) -> None:
        """Log a warning naming each host limit too low for the machines, and the fix."""


class MissingCapability(ProviderError):
    """A provider lacks a capability the caller needs."""

    def __init__(self, provider: Any, capability: type, needed_for: str):
        self.provider, self.capability = provider, capability
        name = getattr(provider, "name", "") or type(provider).__name__
        methods = ", ".join(k for k, v in vars(capability).items() if callable(v) and not k.startswith("_"))
        hint = getattr(provider, "owner_hint", "")
        super().__init__(f"provider {name!r} has no {capability.__name__} capability ({methods}), needed for "
                         f"{needed_for}" + (f"; {hint} does this, not the harness" if hint else ""))


def require(provider: Any, *capabilities: type, needed_for: str) -> Any:
    """``provider``, or a :class:`MissingCapability` naming the first capability it lacks."""
    for capability in capabilities:
        if not isinstance(provider, capability):
            raise MissingCapability(provider, capability, needed_for)
    return provider


class MachineProvider(abc.ABC):
    """A convenient base for providers: options, their validation, defaults derived from
    other capabilities. A provider implements the capabilities above that it has; the
    harness checks for them with ``isinstance``. Registered by name in
    :mod:`providers.registry` (or entry points of group ``kube_harness.providers``).

    Implementations must be safe to call from several processes (xdist
    workers): every operation is keyed by names and labels, not local state.
    """

    name: str = ""
    #: for providers of machines someone else makes: who does what this provider cannot
    owner_hint: str = ""

    def __init__(self, options: Mapping[str, Any] | None = None):
        self.options = dict(options or {})

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        """Check ``spec.provider.options`` when the spec is loaded, before
        anything is created: raise :class:`OptionError` naming the option and
        what is allowed. The default accepts anything."""

    def wait_booted(self, machine: Machine, timeout: float = 120) -> None:
        """Until :meth:`Machines.health` says booted (needs the Machines and Exec capabilities)."""
        import time
        end = time.monotonic() + timeout
        last = None
        while time.monotonic() < end:
            last = self.health(machine)  # type: ignore[attr-defined]
            if last.booted:
                return
            if not last.running:
                raise ProviderError(f"{machine.name}: machine stopped while booting: {last.detail}\n"
                                    f"{self.logs(machine)[-3000:]}")  # type: ignore[attr-defined]
            time.sleep(0.5)
        raise ProviderError(f"{machine.name}: not booted after {timeout:.0f}s: {last.detail if last else ''}")

    def collect_artifacts(self, machine: Machine, dest_dir: str) -> list[str]:
        """Write the machine's logs into dest_dir; returns files written."""
        return []

    def node_image_problem(self, image: str) -> str | None:
        """Why ``image`` cannot boot this provider's machines; the default cannot tell."""
        return None

    def host_endpoint(self, machine: Machine, port: int) -> tuple[str, int]:
        """Where the harness host reaches ``port`` of the machine."""
        return machine.ip, port

    def close(self) -> None:
        pass


def selector_matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def first(items: Iterable[Any]) -> Any:
    for i in items:
        return i
    return None
