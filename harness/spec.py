"""Cluster spec: a Cluster API shaped YAML document, loaded and validated.

A spec file holds one ``Cluster`` (``harness.k8s.io/v1alpha1``) whose
``spec.topology`` names the control plane and worker MachineDeployments, as
Cluster API's managed topologies do. Every error names the field, the bad
value and what is allowed, before anything is created.
"""
from __future__ import annotations

import copy
import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

API_VERSION = "harness.k8s.io/v1alpha1"
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
from . import versions
from .versions import DEFAULT_VERSION, VERSION_RE  # noqa: F401 (re-exported)


class SpecError(ValueError):
    """A spec field has a bad value."""

    def __init__(self, path: str, value: Any, allowed: str, source: str = ""):
        self.path, self.value, self.allowed = path, value, allowed
        where = f"{source}: " if source else ""
        super().__init__(f"{where}invalid {path}: {value!r}; allowed: {allowed}")


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
    pod_cidr: str
    service_cidr: str
    service_domain: str
    control_plane: MachineDeploymentSpec
    workers: tuple[MachineDeploymentSpec, ...]
    kubeadm_patches: dict[str, Any]
    source: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

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


def _get(d: dict, key: str, path: str, kind: type | tuple, default: Any, source: str) -> Any:
    if not isinstance(d, dict):
        raise SpecError(path.rsplit(".", 1)[0], d, "a mapping", source)
    v = d.get(key, default)
    if v is None and default is None:
        raise SpecError(path, None, f"a value of type {_tname(kind)} (field is required)", source)
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise SpecError(path, v, f"a value of type {_tname(kind)}", source)
    return v


def _tname(kind: type | tuple) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return {"str": "string", "int": "integer", "dict": "mapping", "list": "list"}.get(kind.__name__, kind.__name__)


def _name(v: str, path: str, source: str) -> str:
    if not NAME_RE.match(v) or len(v) > 40:
        raise SpecError(path, v, "a DNS-1123 label: lowercase letters, digits and '-', at most 40 characters", source)
    return v


def _cidr(v: str, path: str, source: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(v, strict=True)
    except ValueError:
        raise SpecError(path, v, "an IPv4 network in CIDR form, e.g. 10.244.0.0/16", source) from None
    if net.version != 4 or net.prefixlen > 24:
        raise SpecError(path, v, "an IPv4 network with a prefix of /24 or shorter", source)
    return net


KNOWN_SPEC_KEYS = {"provider", "clusterNetwork", "topology", "kubeadm"}
KNOWN_TOPOLOGY_KEYS = {"version", "controlPlane", "workers"}


def parse(doc: Any, source: str = "", providers: set[str] | None = None) -> ClusterSpec:
    """Validate a Cluster document and return its spec."""
    if not isinstance(doc, dict):
        raise SpecError("(document)", type(doc).__name__, "a YAML mapping with kind: Cluster", source)
    api = doc.get("apiVersion")
    if api != API_VERSION:
        raise SpecError("apiVersion", api, API_VERSION, source)
    if doc.get("kind") != "Cluster":
        raise SpecError("kind", doc.get("kind"), "Cluster", source)
    meta = _get(doc, "metadata", "metadata", dict, None, source)
    name = _name(_get(meta, "name", "metadata.name", str, None, source), "metadata.name", source)
    ns = _name(_get(meta, "namespace", "metadata.namespace", str, "default", source), "metadata.namespace", source)
    spec = _get(doc, "spec", "spec", dict, None, source)
    for k in spec:
        if k not in KNOWN_SPEC_KEYS:
            raise SpecError(f"spec.{k}", spec[k], f"one of the fields {sorted(KNOWN_SPEC_KEYS)}", source)

    prov = _get(spec, "provider", "spec.provider", dict, {}, source)
    pname = _get(prov, "name", "spec.provider.name", str, "docker", source)
    if providers is None:
        from providers import registry

        providers = set(registry.names())
    if pname not in providers:
        raise SpecError("spec.provider.name", pname, f"one of the registered providers {sorted(providers)}", source)
    popts = _get(prov, "options", "spec.provider.options", dict, {}, source)
    _provider_options(pname, popts, source)

    net = _get(spec, "clusterNetwork", "spec.clusterNetwork", dict, {}, source)
    pods = _get(net, "pods", "spec.clusterNetwork.pods", str, "10.244.0.0/16", source)
    svcs = _get(net, "services", "spec.clusterNetwork.services", str, "10.96.0.0/16", source)
    pnet, snet = _cidr(pods, "spec.clusterNetwork.pods", source), _cidr(svcs, "spec.clusterNetwork.services", source)
    if pnet.prefixlen > 16:
        raise SpecError("spec.clusterNetwork.pods", pods, "a /16 or larger network (each node gets a /24)", source)
    if pnet.overlaps(snet):
        raise SpecError("spec.clusterNetwork.services", svcs, f"a network that does not overlap pods {pods}", source)
    domain = _get(net, "serviceDomain", "spec.clusterNetwork.serviceDomain", str, "cluster.local", source)

    topo = _get(spec, "topology", "spec.topology", dict, None, source)
    for k in topo:
        if k not in KNOWN_TOPOLOGY_KEYS:
            raise SpecError(f"spec.topology.{k}", topo[k], f"one of the fields {sorted(KNOWN_TOPOLOGY_KEYS)}", source)
    version = _get(topo, "version", "spec.topology.version", str, DEFAULT_VERSION, source)
    why = versions.problem(version)
    if why:
        raise SpecError("spec.topology.version", version, why, source)

    cp = _get(topo, "controlPlane", "spec.topology.controlPlane", dict, {}, source)
    cpr = _get(cp, "replicas", "spec.topology.controlPlane.replicas", int, 1, source)
    if cpr < 1:
        raise SpecError("spec.topology.controlPlane.replicas", cpr, "an integer >= 1", source)
    if cpr % 2 == 0:
        raise SpecError("spec.topology.controlPlane.replicas", cpr,
                        "an odd number (1, 3, 5...): stacked etcd needs an odd member count for quorum", source)
    cp_labels = _labels(cp, "spec.topology.controlPlane.labels", source)
    control = MachineDeploymentSpec(f"{name}-control-plane", "control-plane", cpr, cp_labels)

    workers_doc = _get(topo, "workers", "spec.topology.workers", dict, {}, source)
    mds = _get(workers_doc, "machineDeployments", "spec.topology.workers.machineDeployments", list, [], source)
    workers, seen = [], set()
    for i, md in enumerate(mds):
        p = f"spec.topology.workers.machineDeployments[{i}]"
        mdn = _name(_get(md, "name", f"{p}.name", str, None, source), f"{p}.name", source)
        if mdn in seen:
            raise SpecError(f"{p}.name", mdn, "a name unique among machineDeployments", source)
        seen.add(mdn)
        r = _get(md, "replicas", f"{p}.replicas", int, 1, source)
        if r < 1:
            raise SpecError(f"{p}.replicas", r, "an integer >= 1 (remove the MachineDeployment for none)", source)
        workers.append(MachineDeploymentSpec(f"{name}-{mdn}", "worker", r, _labels(md, f"{p}.labels", source)))
    if cpr + sum(w.replicas for w in workers) > 10:
        raise SpecError("spec.topology", cpr + sum(w.replicas for w in workers), "at most 10 machines in all", source)

    patches = _get(spec, "kubeadm", "spec.kubeadm", dict, {}, source)
    for k in patches:
        if k not in ("clusterConfiguration", "initConfiguration", "joinConfiguration", "kubeletConfiguration",
                     "kubeProxyConfiguration"):
            raise SpecError(f"spec.kubeadm.{k}", patches[k], "clusterConfiguration, initConfiguration, "
                            "joinConfiguration, kubeletConfiguration or kubeProxyConfiguration", source)
    return ClusterSpec(name, ns, version, pname, popts, pods, svcs, domain, control, tuple(workers),
                       patches, source, copy.deepcopy(doc))


def _labels(d: dict, path: str, source: str) -> dict[str, str]:
    labels = _get(d, "labels", path, dict, {}, source)
    for k, v in labels.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise SpecError(f"{path}.{k}", v, "string keys and string values", source)
    return dict(labels)


def _provider_options(name: str, options: dict[str, Any], source: str) -> None:
    from providers import registry
    from providers.base import OptionError
    try:
        check = getattr(registry.factory(name), "validate_options", None)
    except (KeyError, ImportError):
        return  # a provider named by the caller's own list: nothing to check
    if check is None:
        return
    try:
        check(options)
    except OptionError as e:
        raise SpecError(f"spec.provider.options.{e.field}", e.value, e.allowed, source) from None


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
