"""How Cluster API Machine objects become the harness's machines, and which
provider reaches them (harness.capi.machines, providers.registry)."""
from __future__ import annotations

import pytest
from kubernetes import client

from harness.capi.machines import CapiMachines, deployment_of
from harness.capi.workload import host_patches, set_cluster_network
from providers import registry
from providers.base import (Cleanup, Exec, Machines, MissingCapability, ProviderError, Provisioning,
                            require)
from providers.docker import DockerProvider


def machine_object(name: str, labels: dict, phase: str = "Running", node: str | None = None,
                   provider_id: str = "", deleting: bool = False) -> dict:
    meta = {"name": name, "namespace": "ns1", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T10:00:00Z"
    status = {"phase": phase, "addresses": [{"type": "ExternalDNS", "address": "x"},
                                            {"type": "InternalIP", "address": "172.18.0.5"}]}
    if node:
        status["nodeRef"] = {"name": node}
    return {"metadata": meta, "spec": {"clusterName": "wl", "providerID": provider_id,
                                       "infrastructureRef": {"name": f"{name}-infra"}}, "status": status}


@pytest.fixture
def view():
    return CapiMachines(client.ApiClient())  # no calls are made by the mapping


def test_control_plane_machine(view):
    m = view._to_machine(machine_object("wl-abc", {"cluster.x-k8s.io/cluster-name": "wl",
                                                   "cluster.x-k8s.io/control-plane": ""},
                                        node="wl-abc-node", provider_id="docker:////wl-abc-node"))
    assert (m.name, m.cluster, m.namespace, m.role, m.deployment) == \
        ("wl-abc-node", "wl", "ns1", "control-plane", "wl-control-plane")
    assert (m.state, m.addresses, m.provider_id) == ("running", ("172.18.0.5",), "docker:////wl-abc-node")
    assert view.machine_object(m) == "wl-abc"


def test_worker_of_a_topology_machine_deployment(view):
    labels = {"cluster.x-k8s.io/deployment-name": "wl-md-0-x7k2p", "topology.cluster.x-k8s.io/deployment-name": "md-0"}
    m = view._to_machine(machine_object("wl-md-0-1", labels, phase="Provisioning"))
    assert (m.role, m.deployment, m.state) == ("worker", "wl-md-0", "provisioning")
    assert m.name == "wl-md-0-1-infra"  # no Node yet: the infrastructure machine's name


def test_worker_without_topology_and_deleting(view):
    m = view._to_machine(machine_object("a", {"cluster.x-k8s.io/deployment-name": "wl-workers"}, deleting=True))
    assert (m.deployment, m.state) == ("wl-workers", "deleting")
    assert deployment_of("wl", {}) == ""


def test_machines_reached_through_their_provider_id_scheme(view):
    docker_machine = view._to_machine(machine_object("a", {}, node="n", provider_id="docker:////n"))
    assert isinstance(view.access(docker_machine), DockerProvider)
    assert "docker" in registry.machine_access_schemes()
    assert registry.machine_access("nope://x") is None
    assert isinstance(registry.machine_access("kind://docker/kind/kind-worker"), DockerProvider)
    assert isinstance(registry.machine_access("kube-harness://docker/default/kh-md-0-a1b2c"), DockerProvider)
    assert registry.machine_access("kube-harness://nope/default/x") is None
    with pytest.raises(ProviderError, match=r"no provider reaches machines with providerID scheme 'aws'.*"
                                            r"kube_harness.machine_access"):
        view.access(view._to_machine(machine_object("b", {}, provider_id="aws:///eu-1a/i-0123")))
    with pytest.raises(ProviderError, match="no spec.providerID yet"):
        view.access(view._to_machine(machine_object("c", {}, phase="Pending")))
    # the controllers make and delete these machines: the view has no such capabilities
    assert isinstance(view, Machines) and isinstance(view, Exec)
    assert not isinstance(view, Cleanup) and not isinstance(view, Provisioning)
    with pytest.raises(MissingCapability, match=r"provider 'cluster-api' has no Cleanup capability \(list_owned, "
                                                r"delete_owned\), needed for teardown; Cluster API's controllers "
                                                r".* does this, not the harness"):
        require(view, Machines, Cleanup, needed_for="teardown")


def test_template_adjustments():
    docs = [{"kind": "Cluster", "metadata": {"name": "wl"},
             "spec": {"clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}}}},
            {"kind": "KubeadmConfigTemplate", "metadata": {"name": "t"},
             "spec": {"template": {"spec": {"joinConfiguration": {"nodeRegistration": {
                 "ignorePreflightErrors": ["Swap"]}}}}}}]
    net = set_cluster_network(docs, "wl", "10.210.0.0/16", "10.211.0.0/16", "cluster.local")
    assert net[0]["spec"]["clusterNetwork"] == {"pods": {"cidrBlocks": ["10.210.0.0/16"]},
                                                "services": {"cidrBlocks": ["10.211.0.0/16"]},
                                                "serviceDomain": "cluster.local"}
    assert docs[0]["spec"]["clusterNetwork"]["pods"]["cidrBlocks"] == ["192.168.0.0/16"]  # a copy
    v1 = host_patches(docs, cgroup_v1=True)[1]["spec"]["template"]["spec"]["joinConfiguration"]["nodeRegistration"]
    assert v1["ignorePreflightErrors"].count("Swap") == 1 and "SystemVerification" in v1["ignorePreflightErrors"]
    assert v1["kubeletExtraArgs"] == [{"name": "fail-cgroupv1", "value": "false"}]
    v2 = host_patches(docs, cgroup_v1=False)[1]["spec"]["template"]["spec"]["joinConfiguration"]["nodeRegistration"]
    assert "kubeletExtraArgs" not in v2 and "SystemVerification" not in v2["ignorePreflightErrors"]
