"""The real Cluster API providers (core, kubeadm bootstrap, KubeadmControlPlane,
CAPD), built from the Go module proxy, installed by ``clusterctl init`` into a
management cluster of their own (configs/capi-management.yaml), with the
webhook certificates the harness issues in place of cert-manager."""
from __future__ import annotations

import base64
import uuid
from pathlib import Path

import pytest
from cryptography import x509
from kubernetes import client

from harness.build import capi as capi_build
from harness.build.nodeimage import build_node_image
from harness.build import testimages
from harness.capi import capd
from harness.capi import workload as workload_mod
from harness.capi.install import install, provider_namespaces
from harness.capi.repository import CLUSTERCTL_NAMES, build_repository
from harness.spec import load
from harness.waits import node_ready, until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def providers(request):
    from harness.plugin import ClusterFactory
    f = ClusterFactory(request.config, request)
    before = request.session.testsfailed
    try:
        capi_dir = capi_build.build_capi()
        images = capi_build.build_capi_images(capi_dir)
        repo = build_repository(capi_dir, images)
        capd.build_lb_image()
        mgmt = f(load(ROOT / "configs" / "capi-management.yaml"))
        ctl = install(mgmt, repo, capi_dir / "bin" / "clusterctl", sorted(images.values()))
        yield mgmt, ctl, repo, images
    finally:
        f.finish(request.session.testsfailed > before)


def test_managers_run_the_local_images(providers):
    mgmt, _, repo, images = providers
    apps = client.AppsV1Api(mgmt.api_client())
    running = {}
    for ns in provider_namespaces(repo):
        for d in apps.list_namespaced_deployment(ns).items:
            c = d.spec.template.spec.containers[0]
            running[ns] = (c.image, c.image_pull_policy, d.status.available_replicas)
    assert sorted(i for i, _, _ in running.values()) == sorted(images.values()), running
    assert {p for _, p, _ in running.values()} == {"IfNotPresent"}
    assert all(a == 1 for _, _, a in running.values()), running


def test_clusterctl_inventory(providers):
    """clusterctl recorded what it installed (``clusterctl move`` and upgrades read this)."""
    mgmt, _, repo, _ = providers
    items = client.CustomObjectsApi(mgmt.api_client()).list_cluster_custom_object(
        "clusterctl.cluster.x-k8s.io", "v1alpha3", "providers")["items"]
    got = sorted((i["type"], i["providerName"], i["version"]) for i in items)
    want = sorted((kind, name, repo.versions[p]) for p, (name, kind, _) in CLUSTERCTL_NAMES.items())
    assert got == want


def test_webhook_certificates_issued_and_injected(providers):
    mgmt, _, repo, _ = providers
    api = mgmt.api_client()
    core, ext = client.CoreV1Api(api), client.ApiextensionsV1Api(api)
    custom = client.CustomObjectsApi(api)
    for ns in provider_namespaces(repo):
        certs = custom.list_namespaced_custom_object("cert-manager.io", "v1", ns, "certificates")["items"]
        assert len(certs) == 1, (ns, certs)
        spec = certs[0]["spec"]
        secret = core.read_namespaced_secret(spec["secretName"], ns)
        cert = x509.load_pem_x509_certificate(base64.b64decode(secret.data["tls.crt"]))
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
        assert sorted(sans) == sorted(spec["dnsNames"])
        ready = {c["type"]: c["status"] for c in certs[0].get("status", {}).get("conditions", [])}
        assert ready.get("Ready") == "True"
    # every conversion webhook of the providers' CRDs has a CA bundle
    capi_crds = [c for c in ext.list_custom_resource_definition().items if c.spec.group.endswith("cluster.x-k8s.io")
                 and c.spec.group != "clusterctl.cluster.x-k8s.io"]
    assert len(capi_crds) >= 29
    missing = [c.metadata.name for c in capi_crds if c.spec.conversion.strategy == "Webhook"
               and not c.spec.conversion.webhook.client_config.ca_bundle]
    assert not missing


def test_validating_webhook_rejects_a_bad_object(providers):
    """The webhook servers answer through the injected CA: KubeadmControlPlane's webhook
    refuses an even number of replicas with stacked etcd."""
    mgmt, *_ = providers
    name = f"kcp-{uuid.uuid4().hex[:6]}"
    kcp = f"""
apiVersion: controlplane.cluster.x-k8s.io/v1beta2
kind: KubeadmControlPlane
metadata:
  name: {name}
  namespace: default
spec:
  replicas: 2
  version: v1.36.3
  machineTemplate:
    spec:
      infrastructureRef:
        apiGroup: infrastructure.cluster.x-k8s.io
        kind: DockerMachineTemplate
        name: {name}
"""
    r = mgmt.kubectl("apply", "--dry-run=server", "-f", "-", input=kcp.encode(), check=False)
    assert not r.ok
    # only KCP's webhook says this (no CRD schema rule does)
    assert "cannot be an even number when etcd is stacked" in r.stderr, r.stderr


def test_conversion_webhook_serves_older_api_versions(providers):
    """An object written at v1beta2 is read back at v1beta1 through the core provider's
    conversion webhook."""
    mgmt, *_ = providers
    name = f"cc-{uuid.uuid4().hex[:6]}"
    custom = client.CustomObjectsApi(mgmt.api_client())
    body = {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"paused": True, "clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerCluster",
                                           "name": name}}}
    custom.create_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", "default", "clusters", body)
    try:
        old = custom.get_namespaced_custom_object("cluster.x-k8s.io", "v1beta1", "default", "clusters", name)
        assert old["apiVersion"] == "cluster.x-k8s.io/v1beta1"
        assert old["spec"]["clusterNetwork"]["pods"]["cidrBlocks"] == ["192.168.0.0/16"]
    finally:
        custom.delete_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", "default", "clusters", name)


def test_clusterctl_sees_the_providers(providers):
    _, ctl, _, _ = providers
    out = ctl.run("version", "-o", "short", cluster=False)
    assert out.strip().startswith("v1.13"), out
    # `clusterctl upgrade plan` reads the inventory and the local repository
    plan = ctl.run("upgrade", "plan", timeout=120)
    assert "cluster-api" in plan and "docker" in plan, plan


@pytest.fixture(scope="module")
def workload(providers):
    """A workload cluster from CAPD's development flavor (the quick-start ClusterClass):
    one KubeadmControlPlane machine and one MachineDeployment worker, made by CAPD from
    the harness's node image, bootstrapped by CABPK/KCP."""
    mgmt, ctl, _, _ = providers
    version = mgmt.spec.version
    # the management cluster's own node image (cached), which CAPD finds as kindest/node:<version>
    capd.tag_node_image(build_node_image(version, extra_images=testimages.test_images()), version)
    name = f"kh-wl-{uuid.uuid4().hex[:4]}"
    wl = workload_mod.create(ctl, mgmt, name, name, version, control_planes=1, workers=1, flavor="development")
    try:
        yield mgmt, wl
    finally:
        workload_mod.delete(mgmt, wl)


def test_workload_nodes_ready(workload):
    mgmt, wl = workload
    core = client.CoreV1Api(wl.api_client())
    nodes = until(lambda: (ns := core.list_node().items) and len(ns) == 2 and all(node_ready(n) for n in ns) and ns,
                  300, "2 Ready nodes")
    roles = sorted("control-plane" if "node-role.kubernetes.io/control-plane" in (n.metadata.labels or {})
                   else "worker" for n in nodes)
    assert roles == ["control-plane", "worker"]
    assert {n.status.node_info.kubelet_version for n in nodes} == {mgmt.spec.version}


def test_workload_runs_pods_across_nodes(workload):
    """CoreDNS answers from pods: the CNI DaemonSet routes pod traffic between the nodes."""
    _, wl = workload
    apps = client.AppsV1Api(wl.api_client())
    until(lambda: (d := apps.read_namespaced_deployment("coredns", "kube-system")).status.available_replicas
          == d.spec.replicas, 300, "CoreDNS available")
    ds = apps.read_namespaced_daemon_set("kube-harness-cni", "kube-system")
    assert ds.status.number_ready == ds.status.desired_number_scheduled == 2


def test_scale_machine_deployment_up_and_down(workload):
    """Through the Cluster's topology, as a user of the ClusterClass would: the topology
    controller sets the MachineDeployment's replicas, CAPD makes or removes the machine, and
    the Node joins or leaves."""
    mgmt, wl = workload
    custom = client.CustomObjectsApi(mgmt.api_client())
    core = client.CoreV1Api(wl.api_client())

    def scale(n: int) -> None:
        cl = custom.get_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", wl.namespace, "clusters", wl.name)
        mds = cl["spec"]["topology"]["workers"]["machineDeployments"]
        mds[0]["replicas"] = n
        custom.patch_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", wl.namespace, "clusters", wl.name,
                                              {"spec": {"topology": {"workers": {"machineDeployments": mds}}}})
        until(lambda: len([x for x in core.list_node().items if node_ready(x)]) == 1 + n
              and len(core.list_node().items) == 1 + n, 420, f"{1 + n} Ready nodes")

    scale(2)
    scale(1)


def test_machine_health_check_replaces_a_stopped_worker(workload):
    """The MachineDeployment's health check (the quick-start ClusterClass's, with the timeouts
    shortened through the Cluster's topology): a worker whose machine stops goes NotReady, the
    MachineHealthCheck marks it, its MachineSet deletes it and a new worker joins."""
    mgmt, wl = workload
    import docker
    custom = client.CustomObjectsApi(mgmt.api_client())
    core = client.CoreV1Api(wl.api_client())
    cl = custom.get_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", wl.namespace, "clusters", wl.name)
    mds = cl["spec"]["topology"]["workers"]["machineDeployments"]
    mds[0]["healthCheck"] = {"enabled": True, "checks": {"unhealthyNodeConditions": [
        {"type": "Ready", "status": "Unknown", "timeoutSeconds": 20},
        {"type": "Ready", "status": "False", "timeoutSeconds": 20}]}}
    custom.patch_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", wl.namespace, "clusters", wl.name,
                                          {"spec": {"topology": {"workers": {"machineDeployments": mds}}}})
    until(lambda: custom.list_namespaced_custom_object(
        "cluster.x-k8s.io", "v1beta2", wl.namespace, "machinehealthchecks")["items"], 120, "a MachineHealthCheck")
    workers = [n.metadata.name for n in core.list_node().items
               if "node-role.kubernetes.io/control-plane" not in (n.metadata.labels or {})]
    assert len(workers) == 1, workers
    dk = docker.from_env()
    try:
        dk.containers.get(workers[0]).stop(timeout=5)  # CAPD names the container after the machine
    finally:
        dk.close()

    def replaced() -> bool:
        nodes = core.list_node().items
        names = {n.metadata.name for n in nodes}
        return workers[0] not in names and len(nodes) == 2 and all(node_ready(n) for n in nodes)
    until(replaced, 600, f"{workers[0]} replaced by a new Ready worker")


def test_delete_leaves_nothing_in_docker(workload):
    """Deleting the Cluster makes the controllers remove every machine and the load balancer."""
    mgmt, wl = workload
    import docker
    dk = docker.from_env()
    try:
        label = {"label": f"io.x-k8s.kind.cluster={wl.name}"}
        assert len(dk.containers.list(all=True, filters=label)) == 3  # control plane, worker, load balancer
        workload_mod.delete(mgmt, wl)
        assert dk.containers.list(all=True, filters=label) == []
        assert [v.name for v in dk.volumes.list() if v.name.startswith(wl.name)] == []
    finally:
        dk.close()
