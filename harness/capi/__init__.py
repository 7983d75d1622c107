"""Cluster API mode.

The real providers (core, kubeadm bootstrap, KubeadmControlPlane, CAPD),
built from the Go module proxy (:mod:`harness.build.capi`):

* :mod:`.repository` - a local clusterctl repository of them;
* :mod:`.install` - ``clusterctl init`` into a management cluster;
* :mod:`.certificates` - webhook certificates in place of cert-manager;
* :mod:`.clusterctl` - the clusterctl runner;
* :mod:`.workload` - a workload cluster from a cluster template;
* :mod:`.capd` - the images CAPD starts (node, load balancer).

The Python imitation, to be retired (suites/capi/test_management.py): the
harness's own infrastructure CRDs and Docker machine controller:

* :mod:`.crds` - fetch/cache the CAPI CRDs, load ours, validate objects
  against their openAPI schemas;
* :mod:`.objects` - render the namespaced objects from a spec;
* :mod:`.management` - ``ManagementCluster``: install, apply, wait, delete;
* :mod:`.leader` - Lease-based leader election (coordination.k8s.io/v1);
* :mod:`.controller` - the harness's Docker machine controller process
  (``python -m harness.capi.controller``);
* :mod:`.pivot` - move the objects to another cluster (``clusterctl move``);
* :mod:`.image` / :mod:`.deploy` - the controller's image, built locally, and
  its Deployment inside a cluster (after a pivot: a self-managed cluster).
"""
from __future__ import annotations

CAPI_GROUP = "cluster.x-k8s.io"
CAPI_VERSION = "v1beta1"
CAPI_API = f"{CAPI_GROUP}/{CAPI_VERSION}"
INFRA_GROUP = "infrastructure.harness.k8s.io"
INFRA_VERSION = "v1alpha1"
INFRA_API = f"{INFRA_GROUP}/{INFRA_VERSION}"
#: the Cluster API release whose CRDs are installed (override: $KUBE_HARNESS_CAPI_VERSION)
DEFAULT_CAPI_RELEASE = "v1.8.4"

# Cluster API labels and annotations (sigs.k8s.io/cluster-api/api/v1beta1/common_types.go)
L_CLUSTER_NAME = "cluster.x-k8s.io/cluster-name"
L_CONTROL_PLANE = "cluster.x-k8s.io/control-plane"
L_DEPLOYMENT_NAME = "cluster.x-k8s.io/deployment-name"
L_SET_NAME = "cluster.x-k8s.io/set-name"
L_MOVE = "clusterctl.cluster.x-k8s.io/move"
A_PAUSED = "cluster.x-k8s.io/paused"
#: our finalizers (CAPI core uses cluster.cluster.x-k8s.io / machine.cluster.x-k8s.io)
F_CLUSTER = "cluster.infrastructure.harness.k8s.io"
F_MACHINE = "machine.infrastructure.harness.k8s.io"
#: Secret type CAPI uses for its cluster secrets
SECRET_TYPE = "cluster.x-k8s.io/secret"

INFRA_CLUSTER_KIND = "HarnessDockerCluster"
INFRA_MACHINE_KIND = "HarnessDockerMachine"
INFRA_TEMPLATE_KIND = "HarnessDockerMachineTemplate"
