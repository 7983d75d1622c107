"""Provider registry: built-in providers plus entry points
(group ``kube_harness.providers``) so an external package can add one. A
provider is a :class:`providers.base.MachineProvider` (or any object) with the
capabilities of :mod:`providers.base` it implements; callers check those."""
from __future__ import annotations

from importlib import metadata
from typing import Any, Callable, Mapping

from .base import MachineProvider

GROUP = "kube_harness.providers"
_registered: dict[str, Callable[..., MachineProvider]] = {}


def register(name: str, factory: Callable[..., MachineProvider]) -> None:
    _registered[name] = factory


def _load_entry_points(group: str = GROUP) -> dict[str, Any]:
    try:
        eps = metadata.entry_points(group=group)
    except TypeError:  # python < 3.10
        eps = metadata.entry_points().get(group, [])
    return {ep.name: ep for ep in eps}


def _builtin() -> dict[str, str]:
    return {"docker": "providers.docker:DockerProvider"}


def names() -> list[str]:
    return sorted(set(_registered) | set(_load_entry_points()) | set(_builtin()))


def factory(name: str) -> Callable[..., MachineProvider]:
    """The provider's class (or factory) without instantiating it."""
    if name in _registered:
        return _registered[name]
    eps = _load_entry_points()
    if name in eps:
        return eps[name].load()
    if name in _builtin():
        mod, attr = _builtin()[name].split(":")
        import importlib
        return getattr(importlib.import_module(mod), attr)
    raise KeyError(f"unknown provider {name!r}; registered: {names()}")


def get(name: str, options: Mapping[str, Any] | None = None) -> MachineProvider:
    return factory(name)(options)


# --- reaching machines another controller made (Cluster API mode, existing clusters)
ACCESS_GROUP = "kube_harness.machine_access"


def _builtin_access() -> dict[str, str]:
    """providerID scheme -> the provider that execs into, stops and starts such machines
    by name: CAPD's ``docker:////<container>`` and kind's ``kind://docker/<cluster>/<node>``
    machines are containers named after their Node."""
    return {"docker": "docker", "kind": "docker"}


def machine_access_schemes() -> list[str]:
    return sorted(set(_load_entry_points(ACCESS_GROUP)) | set(_builtin_access()) | {"kube-harness"})


def machine_access_name(provider_id: str) -> str | None:
    """The name of the provider reaching the machine with this ``spec.providerID``, or None:
    entry points of group ``kube_harness.machine_access`` name a provider per scheme; the
    harness's own nodes (``kube-harness://<provider>/<namespace>/<name>``) name theirs."""
    scheme, _, rest = provider_id.partition("://")
    if scheme == "kube-harness":
        name = rest.split("/", 1)[0]
        return name if name in names() else None
    eps = _load_entry_points(ACCESS_GROUP)
    if scheme in eps:
        return eps[scheme].value
    return _builtin_access().get(scheme)


def machine_access(provider_id: str) -> MachineProvider | None:
    """A provider reaching the machine with this ``spec.providerID`` (see :func:`machine_access_name`)."""
    name = machine_access_name(provider_id)
    return get(name) if name else None
