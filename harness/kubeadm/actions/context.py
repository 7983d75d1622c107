"""What the kubeadm actions share: the cluster, the bootstrapper's options,
values one action hands the next, and the bootstrap state.

Bootstrap values (token, certificate key, endpoint, CA hash) are kept in
``<cluster.state_dir>/kubeadm.json`` so another process (an xdist worker, a
later ``--reuse-cluster`` run) can join machines too; when that file is
missing they are recovered from the cluster (:meth:`ActionContext.state`).
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

import yaml

from harness.cluster import Cluster, write_private
from providers.base import LoadBalancer, Machine, require

from .. import config as kconfig

log = logging.getLogger("harness.kubeadm")

REMOTE_DIR = "/etc/kube-harness"
ADMIN_CONF = "/etc/kubernetes/admin.conf"
CA_CERT = "/etc/kubernetes/pki/ca.crt"


class KubeadmError(RuntimeError):
    """A kubeadm step failed; the message has the output's tail."""

    def __init__(self, message: str, output: str = ""):
        self.output = output
        super().__init__(message)


@dataclass(frozen=True)
class Options:
    """The bootstrapper's settings (:class:`~harness.kubeadm.bootstrap.KubeadmBootstrapper`)."""
    verbosity: int = 1
    init_timeout: float = 600
    join_timeout: float = 600
    ready_timeout: float = 300
    join_parallelism: int = 4


#: BootstrapState's fields as kubeadm.json names them
_JSON_NAMES = {"control_plane_endpoint": "controlPlaneEndpoint", "token": "token",
               "certificate_key": "certificateKey", "certs_uploaded": "certsUploaded",
               "ca_cert_hashes": "caCertHashes", "cert_sans": "certSANs", "cgroup_root": "cgroupRoot",
               "cgroup_v1": "cgroupV1", "init_machine": "initMachine", "load_balancer": "loadBalancer"}


@dataclass
class BootstrapState:
    """What joining machines needs from ``kubeadm init`` (kubeadm.json)."""
    control_plane_endpoint: str
    token: str
    certificate_key: str = ""
    certs_uploaded: float = 0  # time.time() of the last certs upload
    ca_cert_hashes: list[str] = field(default_factory=list)
    cert_sans: list[str] = field(default_factory=list)
    cgroup_root: str | None = None
    cgroup_v1: bool = False
    init_machine: str = ""
    load_balancer: str | None = None

    @classmethod
    def path(cls, cluster: Cluster) -> Path:
        return Path(cluster.state_dir) / "kubeadm.json"

    @classmethod
    def load(cls, cluster: Cluster) -> BootstrapState | None:
        """The saved state; None when there is none (or it has no endpoint)."""
        try:
            doc = json.loads(cls.path(cluster).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or not doc.get("controlPlaneEndpoint"):
            return None
        values = {k: doc[j] for k, j in _JSON_NAMES.items() if doc.get(j) is not None}
        values["cgroup_v1"] = bool(values.get("cgroup_v1"))
        values["certs_uploaded"] = float(values.get("certs_uploaded") or 0)
        return cls(**values)

    def save(self, cluster: Cluster) -> None:
        doc = {_JSON_NAMES[k]: v for k, v in asdict(self).items()}
        write_private(self.path(cluster), json.dumps(doc, indent=2))

    @classmethod
    def recover(cls, ctx: ActionContext) -> BootstrapState:
        """Rebuild (and save) the state from a running cluster (no local state)."""
        cluster = ctx.cluster
        cp = ctx.existing_control_plane()
        if not cluster.kubeconfig_path.exists():
            from .kubeadm_init import write_kubeconfig
            lb = cluster.load_balancer()
            write_kubeconfig(cluster, cp, cluster.provider.host_endpoint(lb or cp, kconfig.API_PORT))
        cm = cluster.core.read_namespaced_config_map("kubeadm-config", "kube-system")
        cc = yaml.safe_load(cm.data["ClusterConfiguration"])
        kc = cluster.core.read_namespaced_config_map("kubelet-config", "kube-system")
        kcfg = yaml.safe_load(kc.data["kubelet"])
        lb = cluster.load_balancer()
        st = cls(control_plane_endpoint=cc["controlPlaneEndpoint"], token=kconfig.new_token(),
                 certificate_key=kconfig.new_certificate_key(), certs_uploaded=0,
                 ca_cert_hashes=[kconfig.ca_cert_hash(cluster.provider.copy_from(cp, CA_CERT))],
                 cert_sans=list((cc.get("apiServer") or {}).get("certSANs") or []),
                 cgroup_root=kcfg.get("cgroupRoot"), cgroup_v1=kcfg.get("failCgroupV1") is False,
                 init_machine=cp.name, load_balancer=lb.name if lb else None)
        st.save(cluster)
        return st


class ActionContext:
    """One cluster's bootstrap, shared by the actions (kind's ActionContext)."""

    def __init__(self, cluster: Cluster, options: Options):
        self.cluster = cluster
        self.options = options
        # kubeadm_config -> kubeadm_init
        self.params: kconfig.Params | None = None
        self.load_balancer: Machine | None = None
        self.api_endpoint: tuple[str, int] | None = None  # (host, port) the host reaches the API at

    @property
    def name(self) -> str:
        return self.cluster.name

    def saved_state(self) -> BootstrapState | None:
        return BootstrapState.load(self.cluster)

    def state(self) -> BootstrapState:
        """The saved state, else the one recovered from the cluster."""
        return self.saved_state() or BootstrapState.recover(self)

    def existing_control_plane(self, exclude: Iterable[str] = ()) -> Machine:
        """A running control plane that is already part of the cluster."""
        cluster, ex = self.cluster, set(exclude)
        st = self.saved_state()
        first = st.init_machine if st else None
        cands = [m for m in cluster.control_planes if m.state == "running" and m.name not in ex]
        cands.sort(key=lambda m: (m.name != first, m.name))
        for m in cands:
            r = cluster.provider.exec(m, ["test", "-f", ADMIN_CONF], check=False, timeout=30)
            if r.ok:
                return m
        raise KubeadmError(f"cluster {cluster.namespace}/{cluster.name}: no running control plane with "
                           f"{ADMIN_CONF} (candidates: {[m.name for m in cands]})")

    def update_load_balancer(self, control_planes: Iterable[Machine]) -> Machine:
        """The API load balancer in front of ``control_planes``."""
        cluster = self.cluster
        backends = [(m.name, m.ip) for m in sorted(control_planes, key=lambda m: m.name)]
        require(cluster.provider, LoadBalancer, needed_for="the API load balancer of several control planes")
        return cluster.provider.ensure_load_balancer(cluster.name, cluster.namespace, cluster.owner, backends,
                                                     kconfig.API_PORT)

    def node(self, m: Machine) -> kconfig.Node:
        """The kubeadm config's view of a machine (name, addresses per family, labels)."""
        cluster = self.cluster
        md = cluster.deployments.get(m.deployment)
        labels = dict(md.labels) if md else {}
        ips = tuple(m.address(f) for f in cluster.spec.ip_families)
        if not all(ips):
            raise KubeadmError(f"machine {m.name} has addresses {list(m.addresses)}, none of IP family "
                               f"IPv{cluster.spec.ip_families[ips.index('')]}, which spec.clusterNetwork.ipFamily "
                               f"{cluster.spec.ip_family} needs (the provider's network must have it)")
        return kconfig.Node(name=m.name, ip=ips[0], control_plane=m.role == "control-plane", labels=labels,
                            provider_id=f"kube-harness://{cluster.provider.name}/{cluster.namespace}/{m.name}",
                            ips=ips)
