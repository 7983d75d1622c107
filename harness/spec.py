"""Cluster spec: a Cluster API shaped YAML document, loaded and validated.

A spec file holds one ``Cluster`` (``harness.k8s.io/v1alpha1``) whose
``spec.topology`` names the control plane and worker MachineDeployments, as
Cluster API's managed topologies do. harness/schema.py defines the schema;
every error names the field, the bad value and what is allowed (with a
"did you mean" for a misspelt key), all of them at once, before anything is
created.
"""
from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from . import schema
from .schema import API_VERSION, NAME_RE  # noqa: F401 (re-exported)
from .versions import DEFAULT_VERSION, VERSION_RE  # noqa: F401 (re-exported)


class SpecError(ValueError):
    """Spec fields with bad values: ``path``, ``value`` and ``allowed`` are the
    first one's, ``errors`` holds all of them (one SpecError each); the
    message has one line per error."""

    def __init__(self, path: str, value: Any, allowed: str, source: str = "",
                 errors: list[SpecError] | None = None):
        self.path, self.value, self.allowed, self.source = path, value, allowed, source
        where = f"{source}: " if source else ""
        line = f"{where}invalid {path}: {value!r}; allowed: {allowed}"
        self.errors = errors or [self]
        super().__init__("\n".join([line, *map(str, self.errors[1:])]))

    @classmethod
    def of(cls, errors: list[SpecError]) -> SpecError:
        first = errors[0]
        return cls(first.path, first.value, first.allowed, first.source, errors)


@dataclass(frozen=True)
class MachineDeploymentSpec:
    name: str
    role: str  # "control-plane" or "worker"
    replicas: int
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    namespace: str
    version: str
    provider: str
    provider_options: dict[str, Any]
    pod_cidr: str  # comma-separated, one network per IP family (as kubeadm's podSubnet)
    service_cidr: str  # comma-separated, likewise
    service_domain: str
    control_plane: MachineDeploymentSpec
    workers: tuple[MachineDeploymentSpec, ...]
    kubeadm_patches: dict[str, Any]
    source: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def pod_cidrs(self) -> tuple[str, ...]:
        return tuple(self.pod_cidr.split(","))

    @property
    def service_cidrs(self) -> tuple[str, ...]:
        return tuple(self.service_cidr.split(","))

    @property
    def ip_families(self) -> tuple[int, ...]:
        """4 and/or 6, primary first (from the pod networks)."""
        return tuple(6 if ":" in c else 4 for c in self.pod_cidrs)

    @property
    def ip_family(self) -> str:
        """ipv4, ipv6 or dual (spec.clusterNetwork.ipFamily)."""
        return {(4,): "ipv4", (6,): "ipv6"}.get(self.ip_families, "dual")

    @property
    def minor(self) -> int:
        return int(VERSION_RE.match(self.version).group(2))

    @property
    def deployments(self) -> tuple[MachineDeploymentSpec, ...]:
        return (self.control_plane, *self.workers)

    @property
    def machine_count(self) -> int:
        return sum(d.replicas for d in self.deployments)

    def with_overrides(self, **kw: Any) -> "ClusterSpec":
        raw = copy.deepcopy(self.raw)
        if "name" in kw:
            raw["metadata"]["name"] = kw.pop("name")
        if "version" in kw:
            raw["spec"]["topology"]["version"] = kw.pop("version")
        if "provider" in kw:
            raw["spec"].setdefault("provider", {})["name"] = kw.pop("provider")
        if kw:
            raise TypeError(f"unknown overrides: {sorted(kw)}")
        return parse(raw, self.source)

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.raw)


def parse(doc: Any, source: str = "", providers: set[str] | None = None) -> ClusterSpec:
    """Validate a Cluster document and return its spec; SpecError lists every bad field."""
    if not isinstance(doc, dict):
        raise SpecError("(document)", type(doc).__name__, "a YAML mapping with kind: Cluster", source)
    if providers is None:
        from providers import registry

        providers = set(registry.names())
    try:
        m = schema.Cluster.model_validate(doc, context={"providers": providers})
    except ValidationError as e:
        raise SpecError.of([_error(err, source) for err in e.errors()]) from None
    name, topo, net = m.metadata.name, m.spec.topology, m.spec.cluster_network
    cp = topo.control_plane
    control = MachineDeploymentSpec(f"{name}-control-plane", "control-plane", cp.replicas, dict(cp.labels))
    workers = tuple(MachineDeploymentSpec(f"{name}-{md.name}", "worker", md.replicas, dict(md.labels))
                    for md in topo.workers.machine_deployments)
    return ClusterSpec(name, m.metadata.namespace, topo.version, m.spec.provider.name, m.spec.provider.options,
                       ",".join(net.pods), ",".join(net.services), net.service_domain, control, workers,
                       m.spec.kubeadm.model_dump(by_alias=True, exclude_unset=True), source, copy.deepcopy(doc))


_TYPES = {"int_type": "integer", "string_type": "string", "dict_type": "mapping", "model_type": "mapping",
          "model_attributes_type": "mapping", "list_type": "list"}


def _error(err: ErrorDetails, source: str) -> SpecError:
    """One pydantic error in SpecError's terms."""
    loc, kind, ctx, value = err["loc"], err["type"], err.get("ctx") or {}, err.get("input")
    path = _path(loc)
    if kind == "missing":
        ann = schema.fields_at(loc[:-1])[loc[-1]].annotation
        value, allowed = None, f"{get_args(ann)[0] if get_origin(ann) is Literal else 'a value'} (field is required)"
    elif kind in ("extra_forbidden", "invalid_key"):  # an unknown key, or one that is not a string
        fields = list(schema.fields_at(loc[:-1]))
        close = difflib.get_close_matches(str(loc[-1]), fields, n=1)
        path = f"{_path(loc[:-1])}.{loc[-1]}" if loc[:-1] else str(loc[-1])
        allowed = f"one of the fields {fields}" + (f" (did you mean {close[0]!r}?)" if close else "")
    elif kind == "spec":  # a cross-field rule naming its own field
        path, value, allowed = path + ctx["at"], ctx["value"], ctx["allowed"]
    elif kind == "value_error":
        allowed = str(ctx["error"])
    elif kind == "literal_error":
        expected = ctx["expected"]
        allowed = expected.strip("'") if expected.count("'") == 2 else f"one of {expected}"
    elif kind in _TYPES:
        allowed = f"a value of type {_TYPES[kind]}"
    else:
        allowed = err["msg"]
    return SpecError(path, value, allowed, source)


def _path(loc: tuple) -> str:
    """spec.topology.workers.machineDeployments[0].name; a mapping's bad key is named like its value."""
    out = ""
    for i, part in enumerate(loc):
        if part == "[key]":
            continue
        if isinstance(part, int) and loc[i + 1:i + 2] != ("[key]",):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(document)"


def load(path: str | Path, providers: set[str] | None = None) -> ClusterSpec:
    """Load and validate a spec file. Raises SpecError naming the bad field."""
    p = Path(path)
    if not p.is_file():
        raise SpecError("--cluster-config", str(p), "a path to an existing YAML file (see configs/)")
    try:
        docs = [d for d in yaml.safe_load_all(p.read_text()) if d is not None]
    except yaml.YAMLError as e:
        raise SpecError("(document)", str(e).splitlines()[0], "valid YAML", str(p)) from None
    clusters = [d for d in docs if isinstance(d, dict) and d.get("kind") == "Cluster"]
    if len(clusters) != 1:
        raise SpecError("kind", [d.get("kind") if isinstance(d, dict) else d for d in docs],
                        "exactly one document of kind Cluster", str(p))
    return parse(clusters[0], str(p), providers)
