"""Run the controller *inside* a cluster, as a Deployment (after a pivot,
the workload cluster then runs the controller that manages it).

Needs what a pod cannot otherwise have here:

* the image: built locally (:mod:`.image`) and loaded into every node's
  containerd (no registry; ``imagePullPolicy: Never``);
* the host's Docker engine: the nodes must have been made with the provider
  option ``extra_mounts: [{host_path: /var/run/docker.sock, container_path:
  /var/run/docker.sock}]`` (:data:`DOCKER_SOCKET_MOUNT`), and the pod mounts
  it with a hostPath volume. Node containers are privileged already, so the
  socket gives them nothing they could not do;
* the workload API: ``--workload-endpoint internal`` (the machines' network,
  not the host's published port); the pods use host networking so that the
  node's view of that network is theirs;
* RBAC: a ServiceAccount bound to cluster-admin (test infrastructure).

Pods run on control-plane nodes (tolerating their taint): a scale-down never
drains the controller off a node it is deleting.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from harness.cluster import Cluster
from harness.progress import phase

from .controller import LEASE_NAME
from .management import ManagementCluster, is_status

log = logging.getLogger("harness.capi")
DOCKER_SOCKET_MOUNT = {"host_path": "/var/run/docker.sock", "container_path": "/var/run/docker.sock"}
NAME = "kube-harness-docker-controller"


def manifests(namespace: str, image: str, *, node_image: str | None = None, replicas: int = 2,
              lease: tuple[float, float, float] = (15, 10, 2)) -> list[dict]:
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "kube-harness"}
    args = ["--in-cluster", "--namespace", namespace, "--workload-endpoint", "internal",
            "--lease-duration", str(lease[0]), "--renew-deadline", str(lease[1]), "--retry-period", str(lease[2]),
            "--sync-period", "2", "--log-file", "/tmp/controller.jsonl"]
    if node_image:
        args += ["--node-image", node_image]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": namespace,
                                                                    "labels": labels}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{NAME}-{namespace}", "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
         "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}]},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": NAME, "namespace": namespace, "labels": labels},
         "spec": {"replicas": replicas, "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
                  "template": {"metadata": {"labels": labels}, "spec": {
                      "serviceAccountName": NAME, "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
                      "terminationGracePeriodSeconds": 30,
                      "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
                      "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                                       "effect": "NoSchedule"}],
                      "containers": [{"name": "controller", "image": image, "imagePullPolicy": "Never",
                                      "args": args, "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                              {"name": "ARTIFACTS", "value": "/tmp/artifacts"},
                                                            {"name": "KUBE_HARNESS_CACHE", "value": "/tmp/cache"}],
                                      "securityContext": {"privileged": True},
                                      "volumeMounts": [{"name": "docker-sock", "mountPath": "/var/run/docker.sock"}]}],
                      "volumes": [{"name": "docker-sock", "hostPath": {"path": "/var/run/docker.sock",
                                                                       "type": "Socket"}}]}}}},
    ]


def _apply(mgmt: ManagementCluster, o: dict) -> None:
    from kubernetes import client
    kw: dict[str, Any] = {"field_manager": mgmt.field_manager, "force": True,
                          "_content_type": "application/apply-patch+yaml"}
    name, ns = o["metadata"]["name"], o["metadata"].get("namespace")
    if o["kind"] == "ServiceAccount":
        mgmt.core.patch_namespaced_service_account(name, ns, o, **kw)
    elif o["kind"] == "ClusterRoleBinding":
        client.RbacAuthorizationV1Api(mgmt.api).patch_cluster_role_binding(name, o, **kw)
    elif o["kind"] == "Deployment":
        client.AppsV1Api(mgmt.api).patch_namespaced_deployment(name, ns, o, **kw)
    else:
        raise ValueError(o["kind"])


def deploy(cluster: Cluster, namespace: str, *, node_image: str | None = None, replicas: int = 2,
           image: str | None = None, timeout: float = 300) -> str:
    """Build/load the image and run the controller Deployment in ``cluster``;
    returns the image. Waits until a pod holds the Lease."""
    from harness.images_load import load_images

    from .image import build_controller_image
    mgmt = ManagementCluster(cluster.kubeconfig_path)
    with phase("capi-deploy", cluster=cluster.name, logger=log):
        image = image or build_controller_image()
        load_images(cluster, [image])
        mgmt.ensure_namespace(namespace)
        for o in manifests(namespace, image, node_image=node_image, replicas=replicas):
            _apply(mgmt, o)
        end = time.monotonic() + timeout
        while True:
            holder = mgmt.lease_holder(LEASE_NAME, namespace)
            pods = {p.metadata.name for p in mgmt.core.list_namespaced_pod(
                namespace, label_selector=f"app.kubernetes.io/name={NAME}").items}
            if holder and any(holder.startswith(f"{p}_") for p in pods):
                log.info(f"controller pod {holder.split('_')[0]} leads", extra={"cluster": cluster.name})
                return image
            if time.monotonic() > end:
                raise TimeoutError(f"no controller pod took the Lease within {timeout:.0f}s (holder {holder}, "
                                   f"pods {sorted(pods)}): {pod_logs(mgmt, namespace)[-3000:]}")
            time.sleep(2)


def pod_logs(mgmt: ManagementCluster, namespace: str) -> str:
    out = []
    for p in mgmt.core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/name={NAME}").items:
        try:
            out.append(f"--- {p.metadata.name} ({p.status.phase}) ---\n"
                       + mgmt.core.read_namespaced_pod_log(p.metadata.name, namespace, tail_lines=40))
        except Exception as e:
            out.append(f"--- {p.metadata.name}: {e}")
    return "\n".join(out)


def undeploy(cluster: Cluster, namespace: str, timeout: float = 120) -> None:
    """Delete the Deployment and wait for its pods (they release the Lease)."""
    from kubernetes import client
    mgmt = ManagementCluster(cluster.kubeconfig_path)
    try:
        client.AppsV1Api(mgmt.api).delete_namespaced_deployment(NAME, namespace)
    except Exception as e:
        if not is_status(e, 404):
            raise
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not mgmt.core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/name={NAME}").items:
            break
        time.sleep(2)
    try:
        client.RbacAuthorizationV1Api(mgmt.api).delete_cluster_role_binding(f"{NAME}-{namespace}")
    except Exception as e:
        if not is_status(e, 404):
            raise
