"""The management cluster of a Cluster API session.

Two kinds, one interface (:class:`Management`):

* the harness's own (:func:`own`): a direct-mode cluster
  (configs/capi-management.yaml) with the providers built here installed
  by ``clusterctl init`` (core, kubeadm bootstrap, KubeadmControlPlane,
  CAPD), its templates from the local repository;
* a user's (:func:`external`): a kubeconfig of a cluster where their
  providers already run, and the clusterctl config naming their provider
  repositories (for ``clusterctl generate cluster``).

Workload clusters are then made the same way from either
(:mod:`.controller`): nothing downstream knows which infrastructure
provider runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kubernetes import client, config as kconfig

from harness.cluster import Cluster
from harness.progress import phase
from harness.kubeadm import preflight
from harness.spec import ClusterSpec, SpecError

from .clusterctl import Clusterctl

ROOT = Path(__file__).resolve().parents[2]
MANAGEMENT_CONFIG = ROOT / "configs" / "capi-management.yaml"
#: Kubernetes minors the built Cluster API release (v1.13) supports for workload clusters
BUILT_SUPPORTS = (32, 36)
#: the built CAPD's template for the harness's workload clusters: the quick-start ClusterClass
OWN_FLAVOR = "development"


@dataclass
class Management:
    kubeconfig: Path
    clusterctl: Clusterctl
    flavor: str = ""
    template: str = ""  # ``clusterctl generate cluster --from``
    infrastructure: str = ""  # ``--infrastructure name[:version]``; empty: the only one installed
    #: workload machines are containers on this host: patch their kubeadm config for it
    #: (None: leave the template alone; True/False: whether the host is cgroup v1)
    container_cgroup_v1: bool | None = None
    supports: tuple[int, int] | None = None  # (lowest, highest) Kubernetes minor, when known
    #: called with a Kubernetes version before a workload cluster of it is made
    prepare: Callable[[str], None] = field(default=lambda version: None)
    #: the networks (name: subnets) workload machines are on, when known: their pod and
    #: Service networks must stay clear of them
    machine_networks: Callable[[], dict[str, list[str]]] = field(default=dict)
    cluster: Cluster | None = None  # when the harness made it
    _api: client.ApiClient | None = None

    def api_client(self) -> client.ApiClient:
        if self._api is None:
            self._api = kconfig.new_client_from_config(str(self.kubeconfig))
        return self._api

    def __str__(self) -> str:
        return f"management cluster {self.cluster.name if self.cluster else self.kubeconfig}"


def own(make_cluster: Callable[[ClusterSpec], Cluster], spec: ClusterSpec, install: bool = True) -> Management:
    """Build the providers (cached), make the management cluster of ``spec`` (from
    :data:`MANAGEMENT_CONFIG`) with ``make_cluster`` and install them into it
    (``install=False``: a cluster made earlier that has them)."""
    from harness.build import capi as capi_build

    from . import capd
    from .install import DEFAULT_VARIABLES, install as install_providers
    from .repository import build_repository

    with phase("capi-build"):
        capi_dir = capi_build.build_capi()
        images = capi_build.build_capi_images(capi_dir)
        repo = build_repository(capi_dir, images)
        capd.build_lb_image()
    mgmt = make_cluster(spec)
    if install:
        ctl = install_providers(mgmt, repo, capi_dir / "bin" / "clusterctl", sorted(images.values()))
    else:
        ctl = Clusterctl(capi_dir / "bin" / "clusterctl", repo.config, mgmt.kubeconfig_path, dict(DEFAULT_VARIABLES))
    return Management(mgmt.kubeconfig_path, ctl, flavor=OWN_FLAVOR, infrastructure="docker",
                      container_cgroup_v1=preflight.cgroup_v1(mgmt, mgmt.control_planes[0]),
                      supports=BUILT_SUPPORTS, prepare=capd.prepare_node_image,
                      machine_networks=capd.machine_networks, cluster=mgmt)


def external(kubeconfig: str | Path, clusterctl_config: str | Path | None, *, flavor: str = "", template: str = "",
             infrastructure: str = "", container_nodes: bool = False,
             variables: dict[str, str] | None = None, clusterctl_binary: str | Path | None = None) -> Management:
    """A user's management cluster. ``container_nodes``: the workload's machines are
    containers on this host (node-container kubeadm patches, as for the harness's own)."""
    check_external(kubeconfig, clusterctl_config, template)
    kc = Path(kubeconfig).expanduser()
    binary = Path(clusterctl_binary) if clusterctl_binary else _built_clusterctl()
    config = Path(clusterctl_config).expanduser() if clusterctl_config else _empty_config()
    ctl = Clusterctl(binary, config, kc, dict(variables or {}))
    cgroup_v1 = preflight.host_cgroup_v1() if container_nodes else None
    return Management(kc, ctl, flavor=flavor, template=template, infrastructure=infrastructure,
                      container_cgroup_v1=cgroup_v1)


def check_external(kubeconfig: str | Path, clusterctl_config: str | Path | None, template: str = "") -> None:
    """The files a user's management cluster is given by exist (nothing is built or contacted)."""
    from harness.existing import check_kubeconfig
    check_kubeconfig(kubeconfig, "--capi-management-kubeconfig")
    if clusterctl_config and not Path(clusterctl_config).expanduser().is_file():
        raise SpecError("--capi-clusterctl-config", str(clusterctl_config), "an existing clusterctl config file")
    if template and "://" not in template and not Path(template).expanduser().is_file():
        raise SpecError("--capi-template", template, "an existing cluster template file or a URL")


def _built_clusterctl() -> Path:
    from harness.build import capi as capi_build
    return capi_build.build_capi() / "bin" / "clusterctl"


def _empty_config() -> Path:
    import tempfile
    p = Path(tempfile.gettempdir()) / "kube-harness" / "clusterctl-empty.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("providers: []\n")
    return p
