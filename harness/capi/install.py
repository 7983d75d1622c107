"""Install the real Cluster API providers into a management cluster.

In order:

1. the providers' images into every management node's containerd (there is
   no registry; the components say ``imagePullPolicy: IfNotPresent``);
2. cert-manager's CRDs, the real ones from the cert-manager module, so that
   ``clusterctl init`` finds the cert-manager API and installs nothing from
   the internet;
3. ``clusterctl init`` with the local repository (:mod:`.repository`):
   clusterctl substitutes the variables, applies the components and records
   the providers' inventory (what ``clusterctl move`` and upgrades read);
4. the webhook certificates, issued by the harness (:mod:`.certificates`);
5. every provider's Deployment Available.

CAPD needs the host's Docker engine: the management cluster's nodes must
have been made with ``/var/run/docker.sock`` mounted (:data:`MANAGEMENT_OPTIONS`)
and attached to CAPD's network ``kind``.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from harness.build.cache import run
from harness.build.kube import go_env
from harness.cluster import Cluster
from harness.images_load import load_images
from harness.reached import ExistingCluster
from harness.progress import phase
from harness.waits import until

from .capd import NETWORK as CAPD_NETWORK
from .certificates import CertificateIssuer
from .clusterctl import Clusterctl
from .repository import Repository

log = logging.getLogger("harness.capi")

CERT_MANAGER_MODULE = "github.com/cert-manager/cert-manager"
CERT_MANAGER_VERSION = "v1.21.2"
CERT_MANAGER_CRDS = ("cert-manager.io_certificates.yaml", "cert-manager.io_issuers.yaml",
                     "cert-manager.io_clusterissuers.yaml", "cert-manager.io_certificaterequests.yaml")
DOCKER_SOCKET = "/var/run/docker.sock"
#: Docker provider options a management cluster that runs CAPD needs
MANAGEMENT_OPTIONS = {"extra_mounts": [{"host_path": DOCKER_SOCKET, "container_path": DOCKER_SOCKET}],
                      "networks": [CAPD_NETWORK]}


class InstallError(Exception):
    pass


def cert_manager_crds() -> list[dict]:
    """The cert-manager CRDs of the pinned cert-manager module (downloaded from the Go module proxy)."""
    out = run(["go", "mod", "download", "-json", f"{CERT_MANAGER_MODULE}@{CERT_MANAGER_VERSION}"],
              env=go_env(), what="go mod download cert-manager", cwd=Path("/"))
    src = Path(json.loads(out)["Dir"]) / "deploy" / "crds"
    docs = []
    for name in CERT_MANAGER_CRDS:
        f = src / name
        if not f.is_file():
            raise InstallError(f"{f}: not in {CERT_MANAGER_MODULE}@{CERT_MANAGER_VERSION}")
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d and d.get("kind") == "CustomResourceDefinition"]
    return docs


def apply_crds(api: client.ApiClient, crds: list[dict]) -> None:
    ext = client.ApiextensionsV1Api(api)
    for crd in crds:
        try:
            ext.create_custom_resource_definition(crd)
        except ApiException as e:
            if e.status != 409:
                raise
    for crd in crds:
        until(lambda n=crd["metadata"]["name"]: _established(ext, n), 60, f"CRD {crd['metadata']['name']}")


def _established(ext: client.ApiextensionsV1Api, name: str) -> bool:
    conds = ext.read_custom_resource_definition(name).status.conditions or []
    return any(c.type == "Established" and c.status == "True" for c in conds)


def provider_namespaces(repo: Repository) -> list[str]:
    """The namespaces the repository's components create (one per provider)."""
    out = []
    for comp in sorted(repo.root.glob("*/*/*-components.yaml")):
        out += [d["metadata"]["name"] for d in yaml.safe_load_all(comp.read_text())
                if d and d.get("kind") == "Namespace"]
    return out


def _deployments_available(apps: client.AppsV1Api, namespaces: list[str]) -> list[str]:
    """What is not Available yet (empty when everything is)."""
    waiting = []
    for ns in namespaces:
        deps = apps.list_namespaced_deployment(ns).items
        if not deps:
            waiting.append(f"{ns}: no Deployment")
        for d in deps:
            if (d.status.available_replicas or 0) < (d.spec.replicas or 0) or \
                    (d.status.updated_replicas or 0) < (d.spec.replicas or 0):
                waiting.append(f"{ns}/{d.metadata.name}: {d.status.available_replicas or 0}/{d.spec.replicas} "
                               f"available")
    return waiting


#: clusterctl variables of the components, as Cluster API's own e2e tests set them
DEFAULT_VARIABLES = {"CLUSTER_TOPOLOGY": "true"}  # ClusterClass (the quick-start templates use it)


def install(management: Cluster | ExistingCluster, repo: Repository, clusterctl_binary: Path, images: list[str],
            variables: dict[str, str] | None = None, timeout: float = 600) -> Clusterctl:
    """Install every provider of ``repo`` into ``management`` (a cluster the harness made,
    or any cluster by kubeconfig whose nodes it can reach for ``images``; see module doc);
    returns the clusterctl bound to it. ``variables`` add to/override :data:`DEFAULT_VARIABLES`."""
    ctl = Clusterctl(clusterctl_binary, repo.config, management.kubeconfig_path,
                     {**DEFAULT_VARIABLES, **(variables or {})})
    api = management.api_client()
    namespaces = provider_namespaces(repo)
    with phase("capi-install", cluster=management.name):
        if images:
            with phase("capi-images", cluster=management.name):
                load_images(management, images)
        with phase("cert-manager-crds", cluster=management.name):
            apply_crds(api, cert_manager_crds())
        with phase("clusterctl-init", cluster=management.name):
            ctl.init(repo.init_args())
        with phase("certificates", cluster=management.name):
            issuer = CertificateIssuer(api)
            issued = issuer.reconcile(namespaces)
            if len(issued) < len(namespaces):
                raise InstallError(f"expected a webhook Certificate in each of {namespaces}, found "
                                   f"{[f'{i.namespace}/{i.certificate}' for i in issued]}")
        with phase("providers-available", cluster=management.name):
            apps = client.AppsV1Api(api)
            end, last = time.monotonic() + timeout, None
            while waiting := _deployments_available(apps, namespaces):
                if waiting != last:
                    log.info(f"waiting for {'; '.join(waiting)}", extra={"cluster": management.name,
                                                                         "phase": "providers-available"})
                    last = waiting
                if time.monotonic() > end:
                    raise InstallError(f"providers not available after {timeout:.0f}s: {waiting}")
                time.sleep(3)
    return ctl
