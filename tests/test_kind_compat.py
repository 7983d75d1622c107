"""kind runs the harness's node image.

kind v0.33.0, built here from the Go module proxy (:func:`harness.build.kind.build_kind`),
makes a cluster (one control plane, one worker) with ``kind create cluster
--image <the harness's node image>`` and the cluster config this host needs
(:func:`harness.build.kind.cluster_config`: ``failCgroupV1: false`` on cgroup
v1, nothing on v2). Then: every Node Ready, CoreDNS available, the default
StorageClass kind installs from the image's manifest binds a PVC for a pod,
and the kind cluster is deleted whatever happened, leaving no container.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config as kconfig

from harness import versions
from harness.build import kind, nodeimage, testimages
from harness.kubeadm import cni_daemonset
from harness.waits import node_ready, until

VERSION = versions.DEFAULT_VERSION
CLUSTER_LABEL = "io.x-k8s.kind.cluster"


def _kind(binary: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=timeout)


def _containers(name: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-a", "-q", "--filter", f"label={CLUSTER_LABEL}={name}"],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def _volumes(containers: list[str]) -> list[str]:
    """The named and anonymous volumes the containers mount (kind's nodes: /var)."""
    if not containers:
        return []
    out = subprocess.run(["docker", "inspect", "--format", '{{range .Mounts}}{{if eq .Type "volume"}}{{.Name}} '
                          "{{end}}{{end}}", *containers], capture_output=True, text=True, check=True).stdout
    return out.split()


def _existing_volumes(names: list[str]) -> list[str]:
    return [v for v in names if subprocess.run(["docker", "volume", "inspect", v], capture_output=True).returncode == 0]


def test_cni_manifest_is_the_harness_cni_templated_with_the_pod_subnet():
    proxy = f"registry.k8s.io/kube-proxy:{VERSION}"
    m = kind.cni_manifest(proxy)
    assert kind.TEMPLATE_MARKER in m.splitlines() and kind.PATCH_MARKER not in m
    # kind's text/template sees one action: .PodSubnet
    assert m.count("{{") == m.count(kind.POD_SUBNET) == 1
    docs = list(yaml.safe_load_all(kind.render_cni_manifest(m, "10.250.0.0/16")))
    assert docs == cni_daemonset.manifests("10.250.0.0/16", "", proxy)


def test_storage_manifest_is_a_default_local_path_class():
    docs = list(yaml.safe_load_all(kind.storage_manifest("p:1", "h:1")))
    sc = next(d for d in docs if d["kind"] == "StorageClass")
    assert sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    assert (sc["metadata"]["name"], sc["provisioner"]) == ("standard", "rancher.io/local-path")
    dep = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert dep["image"] == "p:1" and dep["command"][dep["command"].index("--helper-image") + 1] == "h:1"
    cm = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    assert yaml.safe_load(cm["helperPod.yaml"])["spec"]["containers"][0]["image"] == "h:1"
    assert json.loads(cm["config.json"])["nodePathMap"][0]["paths"] == ["/var/local-path-provisioner"]


@pytest.mark.parametrize("v1", [True, False])
def test_cluster_config_patches_the_kubelet_on_cgroup_v1_only(tmp_path, v1):
    cfg = yaml.safe_load(kind.write_cluster_config(tmp_path / "c.yaml", workers=2, cgroup_v1=v1).read_text())
    assert cfg["kind"] == "Cluster" and cfg["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert [n["role"] for n in cfg["nodes"]] == ["control-plane", "worker", "worker"]
    patches = [yaml.safe_load(p) for p in cfg.get("kubeadmConfigPatches", [])]
    assert patches == ([{"kind": "KubeletConfiguration", "failCgroupV1": False}] if v1 else [])


@pytest.fixture(scope="module")
def kind_binary() -> Path:
    return kind.build_kind() / "kind"


@pytest.fixture(scope="module")
def node_image() -> str:
    # the image direct mode boots (its test images are kind's storage helper already)
    return nodeimage.build_node_image(VERSION, extra_images=testimages.test_images())


@pytest.mark.docker
def test_kind_is_built_from_the_module_proxy(kind_binary):
    out = subprocess.run([str(kind_binary), "version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith(f"kind {kind.KIND_VERSION} ")
    assert kind.build_kind() / "kind" == kind_binary  # cached by version


@pytest.mark.docker
def test_node_image_carries_kinds_contract(node_image):
    out = subprocess.run(["docker", "run", "--rm", "--entrypoint", "sh", node_image, "-c",
                          "cat /kind/version; ls /kind/manifests; test -x /usr/local/bin/entrypoint && echo entry"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [VERSION, "default-cni.yaml", "default-storage.yaml", "entry"]


@pytest.mark.docker
@pytest.mark.slow
def test_kind_create_cluster_with_the_node_image(kind_binary, node_image, tmp_path):
    name = f"kh-kind-{uuid.uuid4().hex[:6]}"
    cfg = kind.write_cluster_config(tmp_path / "kind.yaml", workers=1)
    kubeconfig = tmp_path / "kubeconfig"
    artifacts = Path(os.environ.get("ARTIFACTS", "_artifacts")) / "kind" / name
    timings: dict[str, float] = {}
    volumes: list[str] = []
    t0 = time.monotonic()
    try:
        r = _kind(kind_binary, "create", "cluster", "--name", name, "--image", node_image, "--config", str(cfg),
                  "--kubeconfig", str(kubeconfig), "--retain", "-v", "1")
        timings["kind create cluster"] = time.monotonic() - t0
        volumes = _volumes(_containers(name))
        if r.returncode != 0:
            _kind(kind_binary, "export", "logs", str(artifacts), "--name", name, timeout=300)
            pytest.fail(f"kind create cluster failed (exit {r.returncode}; logs in {artifacts}):\n"
                        f"{(r.stdout + r.stderr)[-6000:]}")
        api = kconfig.new_client_from_config(str(kubeconfig))
        core, apps, storage = client.CoreV1Api(api), client.AppsV1Api(api), client.StorageV1Api(api)
        try:
            nodes = until(lambda: (ns := core.list_node().items) and len(ns) == 2 and all(map(node_ready, ns)) and ns,
                          300, "2 Nodes Ready")
            timings["nodes Ready"] = time.monotonic() - t0
            assert {n.metadata.name for n in nodes} == {f"{name}-control-plane", f"{name}-worker"}
            assert {n.status.node_info.kubelet_version for n in nodes} == {VERSION}
            assert all(n.spec.provider_id.startswith(f"kind://docker/{name}/") for n in nodes)

            def coredns() -> bool:
                d = apps.read_namespaced_deployment("coredns", "kube-system")
                return (d.status.available_replicas or 0) >= (d.spec.replicas or 1)
            until(coredns, 300, "CoreDNS available")
            timings["CoreDNS available"] = time.monotonic() - t0

            default = [sc for sc in storage.list_storage_class().items
                       if (sc.metadata.annotations or {}).get("storageclass.kubernetes.io/is-default-class") == "true"]
            assert [(sc.metadata.name, sc.provisioner) for sc in default] == [("standard", "rancher.io/local-path")]

            ns = "default"
            core.create_namespaced_persistent_volume_claim(ns, {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "kh-pvc"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "16Mi"}}}})
            core.create_namespaced_pod(ns, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "kh-pvc-user"},
                "spec": {"restartPolicy": "Never",
                         "containers": [{"name": "c", "image": testimages.build_busybox(),
                                         "imagePullPolicy": "IfNotPresent",
                                         # the volume, then DNS: CoreDNS runs on the control plane, this
                                         # pod on the worker (the CNI's routes between nodes, kube-proxy)
                                         "command": ["sh", "-c", "echo kind > /data/f && cat /data/f && "
                                                     "nslookup kubernetes.default.svc.cluster.local"],
                                         "volumeMounts": [{"name": "d", "mountPath": "/data"}]}],
                         "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "kh-pvc"}}]}})

            def bound() -> bool:
                return core.read_namespaced_persistent_volume_claim("kh-pvc", ns).status.phase == "Bound"
            until(bound, 180, "PVC kh-pvc Bound by the default StorageClass")
            pvc = core.read_namespaced_persistent_volume_claim("kh-pvc", ns)
            assert pvc.spec.storage_class_name == "standard"

            def done() -> str | None:
                phase = core.read_namespaced_pod("kh-pvc-user", ns).status.phase
                assert phase != "Failed", core.read_namespaced_pod_log("kh-pvc-user", ns)
                return phase == "Succeeded" and phase
            until(done, 180, "the pod writing to the volume to succeed")
            log = core.read_namespaced_pod_log("kh-pvc-user", ns)
            assert log.splitlines()[0] == "kind" and "Name:\tkubernetes.default.svc.cluster.local" in log, log
            assert core.read_namespaced_pod("kh-pvc-user", ns).spec.node_name == f"{name}-worker"
            timings["PVC bound, pod done"] = time.monotonic() - t0
        finally:
            api.close()
    finally:
        t1 = time.monotonic()
        d = _kind(kind_binary, "delete", "cluster", "--name", name, "--kubeconfig", str(kubeconfig), timeout=300)
        timings["kind delete cluster"] = time.monotonic() - t1
        print("timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
        left = _containers(name)
        if left:  # never leave a cluster behind, even when kind failed to delete it
            volumes += _volumes(left)
            subprocess.run(["docker", "rm", "-f", "-v", *left], capture_output=True)
        left_volumes = _existing_volumes(volumes)
        if left_volumes:
            subprocess.run(["docker", "volume", "rm", "-f", *left_volumes], capture_output=True)
    assert d.returncode == 0, d.stdout + d.stderr
    assert left == [], f"kind delete cluster left containers {left}"
    assert len(volumes) == 2 and left_volumes == [], f"kind delete cluster left volumes {left_volumes}"
