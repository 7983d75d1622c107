"""How Cluster API Machine objects become the harness's machines, and which
provider reaches them (harness.capi.machines, providers.registry)."""
from __future__ import annotations

import contextlib

import pytest
from kubernetes import client

from harness.capi.machines import CapiMachines, deployment_of
from harness.capi import capd
from harness.capi.workload import WorkloadError, check_machine_networks, host_patches, set_cluster_network
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


def test_pod_network_clear_of_the_machines_network():
    """A real Docker network in 192.168.x (where Docker puts networks once 172.17-31 are taken)
    and the quick-start template's pod network: refused before anything is applied, naming the
    field, the value and the subnet; the harness's default pod network passes."""
    import docker
    dk = docker.from_env()
    net = dk.networks.create("kh-test-capd-subnets", driver="bridge", ipam=docker.types.IPAMConfig(
        pool_configs=[docker.types.IPAMPool(subnet="192.168.250.0/24")]))
    try:
        found = capd.machine_networks("kh-test-capd-subnets")
        assert found == {"kh-test-capd-subnets": ["192.168.250.0/24"]}
        with pytest.raises(WorkloadError, match=r"Cluster wl: spec\.clusterNetwork\.pods\.cidrBlocks "
                                                r"192\.168\.0\.0/16 overlaps 192\.168\.250\.0/24, the subnet of "
                                                r"Docker network 'kh-test-capd-subnets'.*allowed: a network clear "
                                                r"of 192\.168\.250\.0/24"):
            check_machine_networks("wl", "192.168.0.0/16", "10.128.0.0/12", found)
        with pytest.raises(WorkloadError, match=r"services\.cidrBlocks 192\.168\.250\.128/25"):
            check_machine_networks("wl", "10.244.0.0/16", "192.168.250.128/25", found)
        check_machine_networks("wl", "10.244.0.0/16,fd00:10:244::/56", "10.96.0.0/16", found)
        assert capd.machine_networks("kh-test-no-such-network") == {"kh-test-no-such-network": []}
    finally:
        net.remove()
        dk.close()


def test_leftovers_of_a_capd_cluster_removed():
    """What CAPD made for a cluster it can no longer delete (containers labelled with the
    cluster, volumes named after it) goes; other clusters' stay."""
    import docker
    from providers.docker.nodeimage.base import build_base_image
    dk = docker.from_env()
    image = build_base_image()
    made = [dk.containers.create(image, name=f"kh-test-left{i}-lb", labels={capd.CLUSTER_LABEL: f"kh-test-left{i}"})
            for i in (1, 2)]
    vols = [dk.volumes.create(f"kh-test-left{i}-var") for i in (1, 2)]
    try:
        assert sorted(capd.remove_leftovers("kh-test-left1")) == ["kh-test-left1-lb", "kh-test-left1-var"]
        assert [c.name for c in dk.containers.list(all=True, filters={"label": capd.CLUSTER_LABEL})
                if c.name.startswith("kh-test-left")] == ["kh-test-left2-lb"]
        assert capd.remove_leftovers("kh-test-left1") == []
    finally:
        for c in made:
            with contextlib.suppress(docker.errors.NotFound):
                c.remove(force=True, v=True)
        for v in vols:
            with contextlib.suppress(docker.errors.NotFound):
                v.remove(force=True)
        dk.close()
