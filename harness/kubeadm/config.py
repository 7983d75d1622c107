"""kubeadm configuration for a ClusterSpec (kubeadm API v1beta4, kubeadm 1.31+).

Pure functions: nothing here talks to a machine. ``init_config`` renders the
multi-document file ``kubeadm init --config`` takes (InitConfiguration,
ClusterConfiguration, KubeletConfiguration, KubeProxyConfiguration);
``join_config`` the JoinConfiguration for a worker or a control plane.

The settings for nodes that are containers follow kind's config template
(pkg/cluster/internal/kubeadm/config.go):

* kubelet ``cgroupDriver: systemd`` (containerd's runc uses SystemdCgroup),
  ``failSwapOn: false`` (the host may have swap), ``failCgroupV1: false``
  only on a cgroup v1 host (1.35+ refuses cgroup v1 by default),
  ``imageGCHighThresholdPercent: 100`` and ``evictionHard`` with 0%
  nodefs/imagefs thresholds: the kubelet sees the host's disk and would
  otherwise evict pods / delete preloaded images when the *host* disk fills;
* kube-proxy ``conntrack.maxPerCore: 0``: do not set the global
  nf_conntrack_max sysctl, which is shared with the host and other nodes;
* apiServer certSANs with localhost/127.0.0.1, so the host reaches the API
  through the port Docker publishes on 127.0.0.1.

``spec.kubeadm.<document>`` patch dicts are deep-merged into the matching
document (see :func:`merge`).
"""
from __future__ import annotations

import copy
import dataclasses
import ipaddress
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import yaml

from harness.spec import ClusterSpec

KUBEADM_API = "kubeadm.k8s.io/v1beta4"
KUBELET_API = "kubelet.config.k8s.io/v1beta1"
KUBEPROXY_API = "kubeproxy.config.k8s.io/v1alpha1"
CRI_SOCKET = "unix:///run/containerd/containerd.sock"
API_PORT = 6443
IMAGE_REPOSITORY = "registry.k8s.io"
TOKEN_RE = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
TOKEN_GROUP = "system:bootstrappers:kubeadm:default-node-token"

#: spec.kubeadm key -> document kind it patches
PATCH_TARGETS = {
    "initConfiguration": "InitConfiguration",
    "clusterConfiguration": "ClusterConfiguration",
    "joinConfiguration": "JoinConfiguration",
    "kubeletConfiguration": "KubeletConfiguration",
    "kubeProxyConfiguration": "KubeProxyConfiguration",
}

#: list fields of kubeadm v1beta4 whose items are merged by ``name``
#: (extraArgs, kubeletExtraArgs, extraVolumes, extraEnvs...)
_NAMED_LIST_KEYS = {"extraArgs", "kubeletExtraArgs", "extraVolumes", "extraEnvs"}
#: of those, the ones that are ``[{name, value}]`` argument lists
_ARG_LIST_KEYS = {"extraArgs", "kubeletExtraArgs"}


def new_token() -> str:
    """A random bootstrap token ``[a-z0-9]{6}.[a-z0-9]{16}``."""
    alphabet = string.ascii_lowercase + string.digits
    pick = lambda n: "".join(secrets.choice(alphabet) for _ in range(n))  # noqa: E731
    return f"{pick(6)}.{pick(16)}"


def new_certificate_key() -> str:
    """A key for ``--upload-certs`` (32 random bytes, hex)."""
    return secrets.token_hex(32)


@dataclass(frozen=True)
class Node:
    """What the config needs to know about one machine."""
    name: str
    ip: str  # the primary family's address: the API server's advertise address
    control_plane: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    provider_id: str = ""
    ips: tuple[str, ...] = ()  # one per IP family, primary first (dual-stack); default (ip,)


@dataclass(frozen=True)
class Params:
    """Cluster-wide values decided at bootstrap time (not in the spec)."""
    control_plane_endpoint: str  # host:port every node uses (LB, or the first control plane)
    token: str
    certificate_key: str = ""
    cert_sans: tuple[str, ...] = ()  # extra apiserver SANs (LB address, host addresses)
    ca_cert_hashes: tuple[str, ...] = ()  # "sha256:<hex>"; empty: unsafeSkipCAVerification
    cgroup_root: str | None = None  # kubelet cgroupRoot (e.g. /kubelet) when the node prepared one
    cgroup_v1: bool = False  # the nodes see cgroup v1: the kubelet must be told to run anyway
    kube_proxy_mode: str = "iptables"
    image_pull_policy: str = "Never"  # every image is preloaded: kubeadm must never pull

    def __post_init__(self) -> None:
        if not TOKEN_RE.match(self.token):
            raise ValueError(f"bootstrap token {self.token!r}; allowed: [a-z0-9]{{6}}.[a-z0-9]{{16}}")
        if self.certificate_key and not re.fullmatch(r"[0-9a-f]{64}", self.certificate_key):
            raise ValueError("certificate key: allowed: 64 hex digits (32 bytes)")
        _split_endpoint(self.control_plane_endpoint)


def _split_endpoint(ep: str) -> tuple[str, int]:
    host, sep, port = ep.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"control plane endpoint {ep!r}; allowed: host:port")
    return host.strip("[]"), int(port)


# ----------------------------------------------------------------- merging
def args_list(args: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None) -> list[dict[str, str]]:
    """v1beta4 argument list ``[{name, value}]`` from a mapping (the v1beta3
    form users often write) or an existing list. Values become strings."""
    if not args:
        return []
    if isinstance(args, Mapping):
        return [{"name": str(k), "value": _argval(v)} for k, v in args.items()]
    out = []
    for a in args:
        if not isinstance(a, Mapping) or "name" not in a:
            raise ValueError(f"argument list item {a!r}; allowed: {{name: ..., value: ...}}")
        out.append({"name": str(a["name"]), "value": _argval(a.get("value", ""))})
    return out


def _argval(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "" if v is None else str(v)


def merge(base: Any, patch: Any, key: str = "") -> Any:
    """Strategic-ish deep merge of ``patch`` into ``base`` (returns a new value).

    * mappings merge key by key; a ``None`` value in the patch deletes the key;
    * lists of ``{name: ...}`` items (``extraArgs``, ``kubeletExtraArgs``,
      ``extraVolumes``, ``extraEnvs``) merge by name: a patch item replaces
      the base item of the same name (``value: null`` removes it), others
      are appended. ``extraArgs``/``kubeletExtraArgs`` may be given as a
      mapping ``{flag: value}`` and are converted;
    * any other list, and scalars, replace.
    """
    if isinstance(patch, Mapping) and isinstance(base, Mapping) and key not in _NAMED_LIST_KEYS:
        out = copy.deepcopy(dict(base))
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = merge(out[k], v, k)
            else:
                out[k] = _normalise(k, copy.deepcopy(v))
        return out
    if key in _NAMED_LIST_KEYS and isinstance(base, (list, Mapping)) and isinstance(patch, (list, Mapping)):
        b = _normalise(key, copy.deepcopy(base))
        items: list = []
        if key in _ARG_LIST_KEYS and isinstance(patch, Mapping):
            items = [{"name": str(k), "value": None if v is None else _argval(v)} for k, v in patch.items()]
        else:
            items = list(patch) if isinstance(patch, list) else [patch]
        for item in items:
            if not isinstance(item, Mapping) or "name" not in item:
                raise ValueError(f"{key} item {item!r}; allowed: a mapping with a name")
            idx = next((i for i, x in enumerate(b) if x.get("name") == item["name"]), None)
            if key in _ARG_LIST_KEYS and item.get("value", "") is None:
                if idx is not None:
                    b.pop(idx)
                continue
            new = dict(item)
            if key in _ARG_LIST_KEYS:
                new["value"] = _argval(new.get("value", ""))
            if idx is None:
                b.append(new)
            else:
                b[idx] = new
        return b
    return _normalise(key, copy.deepcopy(patch))


def _normalise(key: str, v: Any) -> Any:
    if key in _ARG_LIST_KEYS and isinstance(v, Mapping):
        return args_list(v)
    if isinstance(v, Mapping):
        return {k: _normalise(k, x) for k, x in v.items()}
    return v


def _patched(doc: dict[str, Any], spec: ClusterSpec) -> dict[str, Any]:
    for pkey, kind in PATCH_TARGETS.items():
        if doc["kind"] == kind and spec.kubeadm_patches.get(pkey):
            patch = dict(spec.kubeadm_patches[pkey])
            for fixed in ("apiVersion", "kind"):
                if fixed in patch and patch[fixed] != doc[fixed]:
                    raise ValueError(f"spec.kubeadm.{pkey}.{fixed}: {patch[fixed]!r}; allowed: {doc[fixed]!r} "
                                     f"(the harness generates kubeadm API {KUBEADM_API})")
            doc = merge(doc, patch)
    return doc


# --------------------------------------------------------------- documents
def _node_registration(node: Node, params: Params) -> dict[str, Any]:
    args = {"node-ip": ",".join(node.ips or (node.ip,))}
    if node.provider_id:
        args["provider-id"] = node.provider_id
    if node.labels:
        args["node-labels"] = ",".join(f"{k}={v}" for k, v in sorted(node.labels.items()))
    nr: dict[str, Any] = {
        "name": node.name,
        "criSocket": CRI_SOCKET,
        "imagePullPolicy": params.image_pull_policy,
        "kubeletExtraArgs": args_list(args),
    }
    if not node.control_plane:
        nr["taints"] = []  # workers: explicitly none
    return nr


def cert_sans(params: Params) -> list[str]:
    """API server SANs: loopback (the host reaches the API through a port
    published on 127.0.0.1), the endpoint's host and the extra SANs. (kubeadm
    adds each control plane's own name and advertise address itself.)"""
    host, _ = _split_endpoint(params.control_plane_endpoint)
    sans: list[str] = []
    for s in ("localhost", "127.0.0.1", host, *params.cert_sans):
        if s and s not in sans:
            sans.append(s)
    return sans


def etcd_local_endpoint(spec: ClusterSpec) -> str:
    """Where a control plane's stacked etcd answers locally: kubeadm binds
    the loopback address of the cluster's primary IP family."""
    return "https://[::1]:2379" if spec.ip_families[0] == 6 else "https://127.0.0.1:2379"


#: the podCIDR size every node gets, per IP family
NODE_CIDR_MASK = {4: 24, 6: 64}


def node_cidr_mask_sizes(spec: ClusterSpec) -> dict[str, str]:
    """kube-controller-manager's node CIDR size flags: one flag on a single
    stack, one per family on dual-stack (where the plain flag is refused)."""
    if len(spec.ip_families) == 1:
        return {"node-cidr-mask-size": str(NODE_CIDR_MASK[spec.ip_families[0]])}
    return {f"node-cidr-mask-size-ipv{f}": str(NODE_CIDR_MASK[f]) for f in spec.ip_families}


def init_documents(spec: ClusterSpec, params: Params, node: Node) -> list[dict[str, Any]]:
    """The documents of ``kubeadm init --config`` for the first control plane."""
    init: dict[str, Any] = {
        "apiVersion": KUBEADM_API,
        "kind": "InitConfiguration",
        "bootstrapTokens": [{
            "token": params.token,
            "description": f"kube-harness bootstrap token for {spec.namespace}/{spec.name}",
            "ttl": "24h0m0s",
            "usages": ["signing", "authentication"],
            "groups": [TOKEN_GROUP],
        }],
        "localAPIEndpoint": {"advertiseAddress": node.ip, "bindPort": API_PORT},
        "nodeRegistration": _node_registration(dataclasses.replace(node, control_plane=True), params),
    }
    if params.certificate_key:
        init["certificateKey"] = params.certificate_key
    cluster: dict[str, Any] = {
        "apiVersion": KUBEADM_API,
        "kind": "ClusterConfiguration",
        "clusterName": spec.name,
        "kubernetesVersion": spec.version,
        "controlPlaneEndpoint": params.control_plane_endpoint,
        "imageRepository": IMAGE_REPOSITORY,
        "certificatesDir": "/etc/kubernetes/pki",
        "networking": {
            "podSubnet": spec.pod_cidr,
            "serviceSubnet": spec.service_cidr,
            "dnsDomain": spec.service_domain,
        },
        "apiServer": {
            "certSANs": cert_sans(params),
        },
        "controllerManager": {
            # kubeadm adds these too when podSubnet is set; explicit because
            # the CNI (cni.py) depends on every node getting spec.podCIDR
            "extraArgs": args_list({
                "allocate-node-cidrs": "true",
                "cluster-cidr": spec.pod_cidr,
                **node_cidr_mask_sizes(spec),
                "enable-hostpath-provisioner": "true",
            }),
        },
        "scheduler": {},
        "etcd": {"local": {"dataDir": "/var/lib/etcd"}},
    }
    kubelet: dict[str, Any] = {
        "apiVersion": KUBELET_API,
        "kind": "KubeletConfiguration",
        "cgroupDriver": "systemd",
        "failSwapOn": False,
        # the kubelet sees the host's disk: do not garbage-collect the
        # preloaded images or evict pods when the *host* fills up (as kind)
        "imageGCHighThresholdPercent": 100,
        "evictionHard": {
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
        },
    }
    if params.cgroup_v1:
        kubelet["failCgroupV1"] = False
    if params.cgroup_root:
        kubelet["cgroupRoot"] = params.cgroup_root
    proxy: dict[str, Any] = {
        "apiVersion": KUBEPROXY_API,
        "kind": "KubeProxyConfiguration",
        "mode": params.kube_proxy_mode,
        "clusterCIDR": spec.pod_cidr,
        "iptables": {"minSyncPeriod": "1s"},
        # do not set the global nf_conntrack_max sysctl (shared with the host)
        "conntrack": {"maxPerCore": 0},
    }
    return [_patched(d, spec) for d in (init, cluster, kubelet, proxy)]


def join_document(spec: ClusterSpec, params: Params, node: Node) -> dict[str, Any]:
    """The JoinConfiguration of a worker or (``node.control_plane``) a
    control plane that gets the certificates kubeadm init uploaded."""
    bt: dict[str, Any] = {"apiServerEndpoint": params.control_plane_endpoint, "token": params.token}
    if params.ca_cert_hashes:
        bt["caCertHashes"] = list(params.ca_cert_hashes)
    else:
        bt["unsafeSkipCAVerification"] = True
    doc: dict[str, Any] = {
        "apiVersion": KUBEADM_API,
        "kind": "JoinConfiguration",
        "discovery": {"bootstrapToken": bt},
        "nodeRegistration": _node_registration(node, params),
    }
    if node.control_plane:
        if not params.certificate_key:
            raise ValueError(f"{node.name}: a control plane join needs the certificate key of the uploaded certs")
        doc["controlPlane"] = {
            "localAPIEndpoint": {"advertiseAddress": node.ip, "bindPort": API_PORT},
            "certificateKey": params.certificate_key,
        }
    return _patched(doc, spec)


def dump(docs: Iterable[Mapping[str, Any]], header: str = "") -> str:
    """Multi-document YAML."""
    body = "---\n".join(yaml.safe_dump(dict(d), sort_keys=False, default_flow_style=False) for d in docs)
    return (f"# {header}\n" if header else "") + body


def init_config(spec: ClusterSpec, params: Params, node: Node) -> str:
    """YAML for ``kubeadm init --config``."""
    return dump(init_documents(spec, params, node),
                f"generated by kube-harness for {spec.namespace}/{spec.name} ({spec.version}): kubeadm init")


def join_config(spec: ClusterSpec, params: Params, node: Node) -> str:
    """YAML for ``kubeadm join --config``."""
    role = "control plane" if node.control_plane else "worker"
    return dump([join_document(spec, params, node)],
                f"generated by kube-harness for {spec.namespace}/{spec.name} ({spec.version}): join {role}")


def ca_cert_hash(ca_pem: bytes) -> str:
    """kubeadm's discovery hash: ``sha256:`` + hex SHA-256 of the CA's
    DER SubjectPublicKeyInfo."""
    import hashlib

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert = x509.load_pem_x509_certificate(ca_pem)
    spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(spki).hexdigest()


def is_ip(s: str) -> bool:
    try:
        ipaddress.ip_address(s)
        return True
    except ValueError:
        return False
