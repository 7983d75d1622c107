"""A cluster the harness did not make, given by kubeconfig (``--kubeconfig``).

:func:`existing_cluster` gives the suites the same :class:`harness.cluster.Cluster`
handle as a cluster the harness made: the spec is read from the cluster
(version from the API server; networks from kubeadm's ClusterConfiguration,
else from the ServiceCIDR objects and the Nodes' pod CIDRs; machines from
the Nodes), and the machines are reached through the provider of their
providerID scheme (:class:`harness.reached.NodeMachines`), or not at all
(``machine_access=False``, a black-box run as sonobuoy does). Nothing is
created or deleted.
"""
from __future__ import annotations

import atexit
import ipaddress
import re
import shutil
import tempfile
from pathlib import Path

import urllib3
import yaml
from kubernetes import client, config as kconfig

from providers.base import Owner

from . import versions
from .cluster import Cluster
from .reached import CONTROL_PLANE_LABEL, NodeMachines
from .spec import ClusterSpec, MachineDeploymentSpec, SpecError

OPTION = "--kubeconfig"


def kubeconfig_problem(path: Path) -> str | None:
    """What keeps the Kubernetes client from using ``path`` (its current context), or None."""
    from kubernetes.config.config_exception import ConfigException
    try:
        kconfig.new_client_from_config(str(path)).close()
    except (ConfigException, OSError, ValueError, TypeError, AttributeError, KeyError) as e:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    except Exception as e:  # the YAML itself
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def check_kubeconfig(path: str | Path, option: str = OPTION) -> Path:
    p = Path(path).expanduser()
    if not p.is_file():
        raise SpecError(option, str(path), "an existing kubeconfig file")
    if why := kubeconfig_problem(p):
        raise SpecError(option, str(path), f"a readable kubeconfig ({why})")
    return p


def _name(kubeconfig: Path) -> str:
    """A DNS-1123 name for the cluster: its current context's cluster name."""
    _, current = kconfig.list_kube_config_contexts(str(kubeconfig))
    raw = (current or {}).get("context", {}).get("cluster") or kubeconfig.stem
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")[:40].strip("-")
    return name or "existing"


def describe(kubeconfig: str | Path) -> ClusterSpec:
    """The spec of the cluster ``kubeconfig`` reaches, read from the cluster."""
    path = check_kubeconfig(kubeconfig)
    api = kconfig.new_client_from_config(str(path))
    api.configuration.retries = 1
    try:
        version = client.VersionApi(api).get_code(_request_timeout=30).git_version.split("+")[0]
        core = client.CoreV1Api(api)
        nodes = core.list_node(_request_timeout=30).items
        pods, services, domain = _networks(api, core, nodes)
    except (client.ApiException, urllib3.exceptions.HTTPError, OSError) as e:
        raise SpecError(OPTION, str(kubeconfig), f"the kubeconfig of a cluster that answers "
                                                 f"({_short(e)})") from None
    finally:
        api.close()
    if why := versions.problem(version):
        raise SpecError(f"{OPTION} (the cluster's version)", version, why)
    name = _name(path)
    cps = sum(1 for n in nodes if CONTROL_PLANE_LABEL in (n.metadata.labels or {}))
    control = MachineDeploymentSpec(f"{name}-control-plane", "control-plane", cps)
    workers = (MachineDeploymentSpec(f"{name}-md-0", "worker", len(nodes) - cps),)
    raw = {"apiVersion": "harness.k8s.io/v1alpha1", "kind": "Cluster",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"provider": {"name": "existing"}, "topology": {"version": version},
                    "clusterNetwork": {"pods": pods, "services": services, "serviceDomain": domain}}}
    return ClusterSpec(name, "default", version, "existing", {}, pods, services, domain, control, workers, {},
                       str(path), raw)


def _networks(api: client.ApiClient, core: client.CoreV1Api, nodes: list) -> tuple[str, str, str]:
    """(pod CIDR, service CIDR, DNS domain): kubeadm's ClusterConfiguration, else the
    cluster's ServiceCIDR and Nodes."""
    try:
        cm = core.read_namespaced_config_map("kubeadm-config", "kube-system")
        net = (yaml.safe_load(cm.data["ClusterConfiguration"]) or {}).get("networking") or {}
        if net.get("podSubnet") and net.get("serviceSubnet"):
            return net["podSubnet"], net["serviceSubnet"], net.get("dnsDomain") or "cluster.local"
    except client.ApiException as e:
        if e.status not in (403, 404):
            raise
    try:  # the ServiceCIDR API (Kubernetes 1.33+)
        cidrs = client.CustomObjectsApi(api).list_cluster_custom_object("networking.k8s.io", "v1", "servicecidrs")
    except client.ApiException as e:
        if e.status not in (403, 404):
            raise
        cidrs = {"items": []}
    services = next((c for sc in cidrs["items"] for c in sc["spec"].get("cidrs", []) if ":" not in c), "")
    node_cidrs = [ipaddress.ip_network(n.spec.pod_cidr) for n in nodes if n.spec.pod_cidr and ":" not in n.spec.pod_cidr]
    pods = str(node_cidrs[0].supernet(new_prefix=16)) if node_cidrs else ""
    return pods, services, "cluster.local"


def _short(e: Exception) -> str:
    reason = getattr(e, "reason", None) or e  # urllib3's MaxRetryError: the connection's own error
    text = str(reason).split("): ", 1)[-1] if isinstance(reason, Exception) else str(reason)
    return (text.splitlines() or [type(e).__name__])[0][:200]


def existing_cluster(kubeconfig: str | Path, owner: Owner, *, machine_access: bool = True) -> Cluster:
    """The handle on the cluster ``kubeconfig`` reaches (see the module doc)."""
    spec = describe(kubeconfig)
    # the handle's own copy of the kubeconfig: one per process, gone when it exits
    root = Path(tempfile.gettempdir()) / "kube-harness"
    root.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix=f"given-{spec.name}-", dir=root))
    atexit.register(shutil.rmtree, state, True)
    path = Path(kubeconfig).expanduser()
    api = kconfig.new_client_from_config(str(path))
    machines = NodeMachines(api, spec.name, deployments={d.role: d.name for d in spec.deployments},
                            access=machine_access)
    cluster = Cluster(spec, machines, owner, state_dir=state)
    cluster.set_kubeconfig(path.read_text())
    cluster.mark_bootstrapped()
    return cluster
