"""The cluster spec's schema, defined once as pydantic models.

Validation (harness.spec.parse) and the JSON Schema for editors
(``kube-harness schema``, configs/schema.json) both come from these models.
Every model forbids unknown keys and is strict (no "3" or true for an
integer). A rule that fails raises ValueError whose text is what is allowed;
a cross-field rule raises a PydanticCustomError of type "spec" whose context
names the field (``at``, appended to the model's path) and its value.
"""
from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Callable, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, WithJsonSchema,
                      field_validator, model_validator)
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from . import versions
from .versions import DEFAULT_VERSION

API_VERSION = "harness.k8s.io/v1alpha1"
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
MAX_MACHINES = 10


def check(problem: Callable[[Any], str | None]) -> AfterValidator:
    """A validator from ``problem(value)``: what is allowed when the value is bad, None when good."""
    def validate(value: Any) -> Any:
        why = problem(value)
        if why:
            raise ValueError(why)
        return value
    return AfterValidator(validate)


def hint(**json_schema: Any) -> Any:
    """JSON Schema keywords for editors (the checking is done by ``check``)."""
    return Field(json_schema_extra=json_schema)


def spec_error(allowed: str, at: str, value: Any) -> PydanticCustomError:
    return PydanticCustomError("spec", "{allowed}", {"allowed": allowed, "at": at, "value": value})


# --- field rules ---------------------------------------------------------

def _name(v: str) -> str | None:
    if NAME_RE.match(v) and len(v) <= 40:
        return None
    return "a DNS-1123 label: lowercase letters, digits and '-', at most 40 characters"


def _domain(v: str) -> str | None:
    if DOMAIN_RE.match(v) and len(v) <= 253 and all(len(p) <= 63 for p in v.split(".")):
        return None
    return "a DNS domain: lowercase DNS-1123 labels separated by dots, e.g. cluster.local"


def _cidr(v: str) -> str | None:
    try:
        net = ipaddress.ip_network(v, strict=True)
    except ValueError:
        return "a network in CIDR form, e.g. 10.244.0.0/16 or fd00:10:244::/56"
    if net.version == 4 and net.prefixlen > 24:
        return "an IPv4 network with a prefix of /24 or shorter"
    return None


#: per IP family: (pods default, services default)
NETWORK_DEFAULTS = {4: ("10.244.0.0/16", "10.96.0.0/16"), 6: ("fd00:10:244::/56", "fd00:10:96::/112")}
IP_FAMILIES = {"ipv4": (4,), "ipv6": (6,), "dual": (4, 6)}


def _pod_cidr(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str | None:
    """Every node gets a /24 (IPv4) or a /64 (IPv6) of the pod network."""
    if net.version == 4:
        return None if net.prefixlen <= 16 else "an IPv4 network of /16 or larger (each node gets a /24)"
    return None if net.prefixlen <= 60 else "an IPv6 network of /60 or larger (each node gets a /64)"


def _service_cidr(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str | None:
    if net.version == 6 and not 108 <= net.prefixlen <= 120:
        return "an IPv6 network from /108 to /120 (the API server's limit for Service IPs)"
    return None


def _label_key(k: str) -> str | None:
    prefix, slash, name = k.rpartition("/")
    if LABEL_NAME_RE.match(name) and len(name) <= 63 and (not slash or _domain(prefix) is None):
        return None
    return ("a label key: an optional DNS subdomain prefix and '/', then at most 63 characters "
            "[A-Za-z0-9] with '-', '_' or '.' inside")


def _label_value(v: str) -> str | None:
    if v == "" or (LABEL_NAME_RE.match(v) and len(v) <= 63):
        return None
    return "a label value: empty or at most 63 characters [A-Za-z0-9] with '-', '_' or '.' inside"


def _cp_replicas(n: int) -> str | None:
    if n < 1:
        return "an integer >= 1"
    if n % 2 == 0:
        return "an odd number (1, 3, 5...): stacked etcd needs an odd member count for quorum"
    return None


def _md_replicas(n: int) -> str | None:
    return None if n >= 1 else "an integer >= 1 (remove the MachineDeployment for none)"


_LABEL_NAME = LABEL_NAME_RE.pattern[1:-1]
Name = Annotated[str, check(_name), hint(pattern=NAME_RE.pattern, maxLength=40)]
Domain = Annotated[str, check(_domain), hint(pattern=DOMAIN_RE.pattern, maxLength=253)]
CIDR_PATTERN = r"^[0-9a-fA-F:.]+/\d{1,3}$"
#: one network, or a list of one per IP family; always a list once validated
Cidrs = Annotated[list[str], BeforeValidator(lambda v: [v] if isinstance(v, str) else v), WithJsonSchema({"oneOf": [
    {"type": "string", "pattern": CIDR_PATTERN},
    {"type": "array", "items": {"type": "string", "pattern": CIDR_PATTERN}, "minItems": 1, "maxItems": 2}]})]
Version = Annotated[str, check(versions.problem), hint(
    pattern=rf"^v1\.({'|'.join(map(str, sorted(versions.RELEASES)))})\.\d+$",
    examples=[r.version for r in versions.RELEASES.values()])]
LabelKey = Annotated[str, check(_label_key)]
LabelValue = Annotated[str, check(_label_value), hint(pattern=f"^({_LABEL_NAME})?$", maxLength=63)]
Labels = Annotated[dict[LabelKey, LabelValue], hint(propertyNames={
    "pattern": f"^({DOMAIN_RE.pattern[1:-1]}/)?{_LABEL_NAME}$"})]


# --- models --------------------------------------------------------------

class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, alias_generator=to_camel,
                              field_title_generator=lambda name, _: to_camel(name))


class Metadata(Model):
    """Name and namespace of the cluster, as a Cluster API object's."""
    name: Name = Field(description="The cluster's name: machines are named after it.")
    namespace: Name = Field("default", description="Namespace of the cluster's objects, as in Cluster API.")


class Provider(Model):
    """The machine provider and its options."""
    name: str = Field("docker", description="A registered machine provider (entry point group "
                      "kube_harness.providers).", examples=["docker"])
    options: dict[str, Any] = Field(default_factory=dict, description="Provider options, checked by the "
                                    "provider when the spec is loaded (docker: see the README).")

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str, info: ValidationInfo) -> str:
        known = (info.context or {}).get("providers")
        if known is not None and name not in known:
            raise ValueError(f"one of the registered providers {sorted(known)}")
        return name

    @model_validator(mode="after")
    def _options(self) -> "Provider":
        _provider_options(self.name, self.options)
        return self


class ClusterNetwork(Model):
    """The cluster's IP family, pod and service networks."""
    ip_family: Literal["ipv4", "ipv6", "dual"] = Field(
        "ipv4", description="ipv4, ipv6 (single stack) or dual (IPv4 first, then IPv6).")
    pods: Cidrs | None = Field(None, description=(
        "Pod network, one per family (a list for dual, IPv4 first): IPv4 /16 or larger (each node gets a /24), "
        "IPv6 /60 or larger (each node gets a /64). Default 10.244.0.0/16, fd00:10:244::/56."))
    services: Cidrs | None = Field(None, description=(
        "Service network, one per family (a list for dual, IPv4 first), not overlapping pods; IPv6 /108 to "
        "/120. Default 10.96.0.0/16, fd00:10:96::/112."))
    service_domain: Domain = Field("cluster.local", description="DNS domain of Services.")

    @model_validator(mode="after")
    def _families(self) -> "ClusterNetwork":
        families = IP_FAMILIES[self.ip_family]
        for key, default_index, rule in (("pods", 0, _pod_cidr), ("services", 1, _service_cidr)):
            given = getattr(self, key)
            if given is None:
                setattr(self, key, [NETWORK_DEFAULTS[f][default_index] for f in families])
                continue
            nets = list(given)
            shown = nets[0] if len(nets) == 1 else nets
            for n in nets:
                why = _cidr(n)
                if why:
                    raise spec_error(why, f".{key}", n)
            got = tuple(ipaddress.ip_network(n).version for n in nets)
            if got != families:
                want = " and ".join(f"IPv{f}" for f in families)
                order = ", IPv4 first" if len(families) > 1 else ""
                raise spec_error(f"{'one network' if len(families) == 1 else 'two networks'}: {want}{order} "
                                 f"(ipFamily {self.ip_family})", f".{key}", shown)
            for n in nets:
                why = rule(ipaddress.ip_network(n))
                if why:
                    raise spec_error(why, f".{key}", n)
            setattr(self, key, nets)
        for p in self.pods:
            for sv in self.services:
                if ipaddress.ip_network(p).overlaps(ipaddress.ip_network(sv)):
                    raise spec_error(f"a network that does not overlap pods {p}", ".services", sv)
        return self


class ControlPlane(Model):
    """The control-plane machines (stacked etcd)."""
    replicas: Annotated[int, check(_cp_replicas), hint(minimum=1, **{"not": {"multipleOf": 2}})] = Field(
        1, description="Number of control-plane machines: odd (1, 3, 5...) for etcd quorum.")
    labels: Labels = Field(default_factory=dict, description="Kubernetes labels of the Nodes.")


class MachineDeployment(Model):
    """A group of identical worker machines."""
    name: Name = Field(description="Unique among machineDeployments; machines are named <cluster>-<name>-...")
    replicas: Annotated[int, check(_md_replicas), hint(minimum=1)] = Field(1, description="Number of machines.")
    labels: Labels = Field(default_factory=dict, description="Kubernetes labels of the Nodes.")


class Workers(Model):
    """The worker machines."""
    machine_deployments: list[MachineDeployment] = Field(default_factory=list, description="Worker groups.")

    @model_validator(mode="after")
    def _unique(self) -> "Workers":
        seen: set[str] = set()
        for i, md in enumerate(self.machine_deployments):
            if md.name in seen:
                raise spec_error("a name unique among machineDeployments", f".machineDeployments[{i}].name", md.name)
            seen.add(md.name)
        return self


class Topology(Model):
    """Kubernetes version and machines, as a Cluster API managed topology."""
    version: Version = Field(DEFAULT_VERSION, description=f"Kubernetes release: {versions.supported()}.")
    control_plane: ControlPlane = Field(default_factory=ControlPlane, description="The control-plane machines.")
    workers: Workers = Field(default_factory=Workers, description="The worker machines.")

    @model_validator(mode="after")
    def _size(self) -> "Topology":
        total = self.control_plane.replicas + sum(md.replicas for md in self.workers.machine_deployments)
        if total > MAX_MACHINES:
            raise spec_error(f"at most {MAX_MACHINES} machines in all", "", total)
        return self


class Kubeadm(Model):
    """Patches merged into the generated kubeadm configuration (free-form kubeadm documents)."""
    cluster_configuration: dict[str, Any] = Field(default_factory=dict, description="kubeadm ClusterConfiguration.")
    init_configuration: dict[str, Any] = Field(default_factory=dict, description="kubeadm InitConfiguration.")
    join_configuration: dict[str, Any] = Field(default_factory=dict, description="kubeadm JoinConfiguration.")
    kubelet_configuration: dict[str, Any] = Field(default_factory=dict, description="KubeletConfiguration.")
    kube_proxy_configuration: dict[str, Any] = Field(default_factory=dict, description="KubeProxyConfiguration.")


class Spec(Model):
    """The desired cluster."""
    provider: Provider = Field(default_factory=Provider, description="Where the machines run.")
    cluster_network: ClusterNetwork = Field(default_factory=ClusterNetwork, description="Pod and service networks.")
    topology: Topology = Field(description="Kubernetes version, control plane and workers.")
    kubeadm: Kubeadm = Field(default_factory=Kubeadm, description="Patches to the kubeadm configuration.")


class Cluster(Model):
    """A kube-harness cluster spec: one Cluster API shaped Cluster document."""
    model_config = ConfigDict(title="kube-harness Cluster")
    api_version: Literal[API_VERSION] = Field(description=f"Always {API_VERSION}.")
    kind: Literal["Cluster"] = Field(description="Always Cluster.")
    metadata: Metadata = Field(description="The cluster's name and namespace.")
    spec: Spec = Field(description="The desired cluster.")


def json_schema() -> dict[str, Any]:
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **Cluster.model_json_schema()}


def fields_at(loc: tuple) -> dict[str, FieldInfo]:
    """The fields (by key) of the mapping at ``loc``, a pydantic error location."""
    model: Any = Cluster
    for part in loc:
        if isinstance(part, str):
            model = _model_in(_by_key(model)[part].annotation)
    return _by_key(model)


def _by_key(model: type[BaseModel]) -> dict[str, FieldInfo]:
    return {f.alias or name: f for name, f in model.model_fields.items()}


def _model_in(tp: Any) -> Any:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    return next((m for a in getattr(tp, "__args__", ()) if (m := _model_in(a))), None)


def _provider_options(name: str, options: dict[str, Any]) -> None:
    from providers import registry
    from providers.base import OptionError
    try:
        validate = getattr(registry.factory(name), "validate_options", None)
    except (KeyError, ImportError):
        return  # a provider named by the caller's own list: nothing to check
    if validate is None:
        return
    try:
        validate(options)
    except OptionError as e:
        raise spec_error(e.allowed, f".options.{e.field}", e.value) from None
