"""kind (sigs.k8s.io/kind) and the node-image contract it relies on.

``kind create cluster --image IMAGE`` runs any image that keeps kind's
conventions (``pkg/build/nodeimage`` and ``pkg/cluster/internal/create`` of
kind v0.33):

* the image's entrypoint prepares the container and execs systemd
  (``/usr/local/bin/entrypoint``); kind waits for "Reached target ...
  Multi-User System" or "detected cgroup v1" in the container's log;
* ``/kind/version``: the Kubernetes version, one line; kind picks its kubeadm
  config API from it and writes ``/kind/kubeadm.conf``;
* kubeadm, kubelet (systemd unit, kubeadm drop-in) and kubectl, containerd on
  ``/run/containerd/containerd.sock``, and every image kubeadm lists
  preloaded: kind skips kubeadm's preflight and never pulls;
* ``/kind/manifests/default-cni.yaml``: created with ``kubectl create``; when
  it holds :data:`TEMPLATE_MARKER` it is a Go template given ``.PodSubnet``;
* ``/kind/manifests/default-storage.yaml``: applied; kind ships
  rancher's local-path-provisioner as the default StorageClass ``standard``.

The harness's node image (:mod:`.nodeimage`) meets it with its own parts:
:func:`cni_manifest` is the harness's CNI as a DaemonSet
(:mod:`harness.kubeadm.cni_daemonset`, ptp + host-local, per-node PodCIDR
routes, on the preloaded kube-proxy image); :func:`storage_manifest` is kind's
local-path setup on local-path-provisioner built here from the Go module proxy
(:data:`LOCAL_PATH_VERSION`), its helper pods on the harness's busybox image
(Debian's busybox-static, which is what upstream's helper image is).

:func:`build_kind` builds the kind CLI itself from the Go module proxy, and
:func:`cluster_config` writes the kind cluster config a host needs (on
cgroup v1, ``failCgroupV1: false`` for the kubelet of Kubernetes 1.35+).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import yaml

from ..kubeadm import cni_daemonset
from ..images_load import normalize
from ..kubeadm.preflight import host_cgroup_v1
from . import images, testimages
from .cache import BuildError, digest, file_digest
from .runtime import check_binary, go_install

KIND_VERSION = "v0.33.0"
KIND_MODULE = "sigs.k8s.io/kind"
LOCAL_PATH_VERSION = "v0.0.30"
LOCAL_PATH_MODULE = "github.com/rancher/local-path-provisioner"
PROVISIONER_REPOSITORY = "kube-harness/local-path-provisioner"

VERSION_FILE = "/kind/version"
CNI_MANIFEST = "/kind/manifests/default-cni.yaml"
STORAGE_MANIFEST = "/kind/manifests/default-storage.yaml"
#: kind renders a CNI manifest holding this line as a Go template (``{{ .PodSubnet }}``)
TEMPLATE_MARKER = "# would you kindly template this file"
#: kind would add CONTROL_PLANE_ENDPOINT to the first container of a manifest holding this
PATCH_MARKER = "would you kindly patch this file"
POD_SUBNET = "{{ .PodSubnet }}"
#: kind's default pod subnet (IPv4), for a manifest rendered outside kind
DEFAULT_POD_SUBNET = "10.244.0.0/16"
CLUSTER_API_VERSION = "kind.x-k8s.io/v1alpha4"


# ------------------------------------------------------------------ binaries
def build_kind(version: str = KIND_VERSION) -> Path:
    """The kind CLI (``bin/kind``), static (CGO_ENABLED=0), from the Go module
    proxy with the module's own go.mod, as upstream's Makefile builds it;
    cached by version and Go version. Returns the bin dir."""
    def check(b: Path) -> None:
        check_binary(b / "kind", ["version"], f"kind {version} ")
    return go_install("kind", KIND_MODULE, version, [(("",), "", "-s -w -buildid=", False)], check) / "bin"


def build_local_path_provisioner(version: str = LOCAL_PATH_VERSION) -> Path:
    """rancher's local-path-provisioner (``bin/local-path-provisioner``),
    static, with its version set as upstream's build script does. Returns the bin dir."""
    def check(b: Path) -> None:
        check_binary(b / "local-path-provisioner", ["--version"], version)
    return go_install("local-path-provisioner", LOCAL_PATH_MODULE, version,
                      [(("",), "", f"-s -w -X main.VERSION={version}", False)], check) / "bin"


def provisioner_image(version: str = LOCAL_PATH_VERSION) -> str:
    """``kube-harness/local-path-provisioner:<version>``: the static binary
    on /usr/local/bin of a minimal rootfs (built or cached)."""
    binary = build_local_path_provisioner(version) / "local-path-provisioner"
    tag = f"{PROVISIONER_REPOSITORY}:{version}"
    h = digest("local-path-image-v1", tag, file_digest(binary))
    return images.binary_image(tag, {"usr/local/bin/local-path-provisioner": binary},
                               ["/usr/local/bin/local-path-provisioner"], h)


# ------------------------------------------------------------------ manifests
class _Dumper(yaml.SafeDumper):
    """Multi-line strings (scripts, embedded files) as literal blocks, readable in the image."""


_Dumper.add_representer(str, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v,
                                                             style="|" if "\n" in v else None))


def _yaml(docs: list[dict]) -> str:
    return "".join("---\n" + yaml.dump(d, Dumper=_Dumper, sort_keys=False) for d in docs)


def cni_manifest(kube_proxy_image: str) -> str:
    """The harness's CNI DaemonSet as kind's default CNI: a template of the
    pod subnet (the only value kind gives it). Service CIDR rules are left out
    (kind does not tell it the service subnet)."""
    body = _yaml(cni_daemonset.manifests(POD_SUBNET, "", kube_proxy_image))
    if "{{" in body.replace(POD_SUBNET, ""):  # text/template: only a left delimiter starts an action
        raise BuildError("the CNI manifest holds '{{' besides .PodSubnet; kind's template would misread it")
    if PATCH_MARKER in body:
        raise BuildError(f"the CNI manifest must not hold {PATCH_MARKER!r}")
    return (f"# kube-harness CNI (ptp + host-local, per-node PodCIDR routes) as kind's default CNI\n"
            f"{TEMPLATE_MARKER}\n{body}")


def render_cni_manifest(manifest: str, pod_subnet: str = DEFAULT_POD_SUBNET) -> str:
    """What kind makes of :func:`cni_manifest` for ``pod_subnet``."""
    return manifest.replace(POD_SUBNET, pod_subnet)


def storage_manifest(provisioner: str, helper: str) -> str:
    """kind's default storage: local-path-provisioner in namespace
    local-path-storage, volumes under /var/local-path-provisioner on the node,
    StorageClass ``standard`` (default, WaitForFirstConsumer)."""
    ns = "local-path-storage"
    sa = "local-path-provisioner-service-account"
    role = "local-path-provisioner-role"
    app = {"app": "local-path-provisioner"}
    config = {"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES",
                               "paths": ["/var/local-path-provisioner"]}]}
    helper_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "helper-pod"},
                  "spec": {"priorityClassName": "system-node-critical",
                           "tolerations": [{"operator": "Exists", "effect": "NoSchedule"},
                                           {"operator": "Exists", "effect": "NoExecute"}],
                           "containers": [{"name": "helper-pod", "image": helper,
                                           "imagePullPolicy": "IfNotPresent"}]}}
    docs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": role, "namespace": ns},
         "rules": [{"apiGroups": [""], "resources": ["pods"],
                    "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role},
         "rules": [{"apiGroups": [""], "resources": ["nodes", "persistentvolumeclaims", "configmaps", "pods",
                                                     "pods/log"], "verbs": ["get", "list", "watch"]},
                   {"apiGroups": [""], "resources": ["persistentvolumes"],
                    "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]},
                   {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
                   {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "local-path-provisioner-bind", "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "local-path-provisioner-bind"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "local-path-provisioner", "namespace": ns},
         "spec": {"replicas": 1, "selector": {"matchLabels": app}, "template": {"metadata": {"labels": app}, "spec": {
             "nodeSelector": {"kubernetes.io/os": "linux"},
             "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Equal",
                              "effect": "NoSchedule"}],
             "serviceAccountName": sa,
             "containers": [{"name": "local-path-provisioner", "image": provisioner,
                             "imagePullPolicy": "IfNotPresent",
                             "command": ["local-path-provisioner", "--debug", "start", "--helper-image", helper,
                                         "--config", "/etc/config/config.json"],
                             "volumeMounts": [{"name": "config-volume", "mountPath": "/etc/config/"}],
                             "env": [{"name": "POD_NAMESPACE",
                                      "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                                     {"name": "CONFIG_MOUNT_PATH", "value": "/etc/config/"}]}],
             "volumes": [{"name": "config-volume", "configMap": {"name": "local-path-config"}}]}}}},
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
         "metadata": {"name": "standard", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
         "provisioner": "rancher.io/local-path", "volumeBindingMode": "WaitForFirstConsumer",
         "reclaimPolicy": "Delete"},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "local-path-config", "namespace": ns},
         "data": {"config.json": json.dumps(config, indent=2),
                  "setup": '#!/bin/sh\nset -eu\nmkdir -m 0777 -p "$VOL_DIR"\n',
                  "teardown": '#!/bin/sh\nset -eu\nrm -rf "$VOL_DIR"\n',
                  "helperPod.yaml": yaml.dump(helper_pod, Dumper=_Dumper, sort_keys=False)}},
    ]
    return "# kind's default storage: local-path-provisioner (built by kube-harness)\n" + _yaml(docs)


# ------------------------------------------------------------------ the node image's part
def node_contract(version: str, component_tags: list[str]) -> tuple[dict[str, str], list[str]]:
    """What the node image of ``version`` carries for kind: ``{path: content}``
    and the images to preload besides kubeadm's (``component_tags``)."""
    kube_proxy = [t for t in component_tags if t.rsplit(":", 1)[0].rsplit("/", 1)[-1] == "kube-proxy"]
    if len(kube_proxy) != 1:
        raise BuildError(f"expected exactly one kube-proxy image among {component_tags}, found {kube_proxy}")
    provisioner, helper = provisioner_image(), testimages.build_busybox()
    files = {VERSION_FILE: version + "\n",
             CNI_MANIFEST: cni_manifest(kube_proxy[0]),
             STORAGE_MANIFEST: storage_manifest(normalize(provisioner),
                                                normalize(helper))}
    return files, [provisioner, helper]


# ------------------------------------------------------------------ kind clusters
def cluster_config(workers: int = 0, *, cgroup_v1: bool | None = None) -> dict:
    """A kind cluster config (``kind: Cluster``): one control plane and
    ``workers`` workers. On a cgroup v1 host (``cgroup_v1`` None: this host)
    the kubelet gets ``failCgroupV1: false``, which Kubernetes 1.35+ needs to
    run there; kind skips kubeadm's preflight, so nothing else is needed."""
    cfg: dict = {"kind": "Cluster", "apiVersion": CLUSTER_API_VERSION,
                 "nodes": [{"role": "control-plane"}] + [{"role": "worker"}] * workers}
    if host_cgroup_v1() if cgroup_v1 is None else cgroup_v1:
        cfg["kubeadmConfigPatches"] = ["kind: KubeletConfiguration\nfailCgroupV1: false\n"]
    return cfg


def write_cluster_config(path: Path | None = None, workers: int = 0, *, cgroup_v1: bool | None = None) -> Path:
    """:func:`cluster_config` as a file for ``kind create cluster --config``."""
    if path is None:
        path = Path(tempfile.mkstemp(prefix="kind-config-", suffix=".yaml")[1])
    path.write_text(_yaml([cluster_config(workers, cgroup_v1=cgroup_v1)]))
    return path
