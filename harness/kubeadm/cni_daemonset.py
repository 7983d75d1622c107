"""The harness's CNI (:mod:`.cni`) as a DaemonSet, for clusters whose
machines the harness does not exec into: workload clusters made by Cluster
API controllers.

Each pod (host network, privileged, on every node whatever its taints)
writes the same sync script, agent and environment the direct mode puts on
a node, plus the long-lived token of ServiceAccount
``kube-system/kube-harness-cni``, into the node's filesystem, then runs the
agent there (``chroot``), as ``kh-cni.service`` does in direct mode. The
image is the cluster's kube-proxy image, which kubeadm's nodes have already
(it has the shell and chroot the pod needs); nothing is pulled.
"""
from __future__ import annotations

from kubernetes import client, utils
from kubernetes.client.rest import ApiException

from . import cni

NAME = "kube-harness-cni"
NAMESPACE = "kube-system"
SCRIPTS = "kube-harness-cni-scripts"

# runs in the pod: put the agent's files on the node, then become the node's agent
ENTRY = f"""set -eu
h=/host
until [ -s /token/token ]; do echo "waiting for the {cni.TOKEN_SECRET} token"; sleep 1; done
mkdir -p $h/etc/kube-harness $h/usr/local/bin
cp /scripts/sync $h{cni.SYNC_PATH}.tmp && chmod 755 $h{cni.SYNC_PATH}.tmp && mv $h{cni.SYNC_PATH}.tmp $h{cni.SYNC_PATH}
cp /scripts/agent $h{cni.AGENT_PATH}.tmp && chmod 755 $h{cni.AGENT_PATH}.tmp && mv $h{cni.AGENT_PATH}.tmp $h{cni.AGENT_PATH}
(umask 077; cp /token/token $h{cni.TOKEN_PATH})
printf 'NODE_NAME=%s\\nCLUSTER_POD_CIDR=%s\\nSERVICE_CIDR=%s\\n' "$NODE_NAME" "$CLUSTER_POD_CIDR" "$SERVICE_CIDR" \\
  > $h{cni.ENV_PATH}
exec chroot $h {cni.AGENT_PATH}
"""


def manifests(pod_cidr: str, service_cidr: str, image: str) -> list[dict]:
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "kube-harness"}
    meta = {"namespace": NAMESPACE, "labels": labels}
    env = [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
           {"name": "CLUSTER_POD_CIDR", "value": pod_cidr}, {"name": "SERVICE_CIDR", "value": service_cidr}]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": cni.SERVICE_ACCOUNT, **meta}},
        {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
         "metadata": {"name": cni.TOKEN_SECRET, **meta,
                      "annotations": {"kubernetes.io/service-account.name": cni.SERVICE_ACCOUNT}}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": cni.CLUSTER_ROLE, "labels": labels},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": cni.CLUSTER_ROLE, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cni.CLUSTER_ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": cni.SERVICE_ACCOUNT, "namespace": NAMESPACE}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": SCRIPTS, **meta},
         "data": {"sync": cni.SYNC_SCRIPT, "agent": cni.AGENT_SCRIPT}},
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": NAME, **meta},
         "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
                  "template": {"metadata": {"labels": labels}, "spec": {
                      "hostNetwork": True, "priorityClassName": "system-node-critical",
                      "tolerations": [{"operator": "Exists"}],
                      "containers": [{"name": "agent", "image": image, "imagePullPolicy": "IfNotPresent",
                                      "command": ["/bin/sh", "-c", ENTRY], "env": env,
                                      "securityContext": {"privileged": True},
                                      "volumeMounts": [{"name": "host", "mountPath": "/host"},
                                                       {"name": "scripts", "mountPath": "/scripts"},
                                                       {"name": "token", "mountPath": "/token"}]}],
                      "volumes": [{"name": "host", "hostPath": {"path": "/"}},
                                  {"name": "scripts", "configMap": {"name": SCRIPTS}},
                                  {"name": "token", "secret": {"secretName": cni.TOKEN_SECRET}}]}}}},
    ]


def install(api: client.ApiClient, pod_cidr: str, service_cidr: str, image: str) -> None:
    """Create the DaemonSet and what it uses (objects that exist are left as they are)."""
    for obj in manifests(pod_cidr, service_cidr, image):
        try:
            utils.create_from_dict(api, obj)
        except utils.FailToCreateError as e:
            if not all(isinstance(x, ApiException) and x.status == 409 for x in e.api_exceptions):
                raise
