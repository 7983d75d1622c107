"""Spec loading and validation: every bad field is named with what is allowed."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.spec import API_VERSION, DEFAULT_VERSION, SpecError, load, parse

ROOT = Path(__file__).resolve().parent.parent
PROVIDERS = {"docker"}


def base() -> dict:
    return yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())


def mutate(path: str, value):
    doc = base()
    cur = doc
    keys = path.split(".")
    for k in keys[:-1]:
        if k.endswith("]"):
            k, i = k[:-1].split("[")
            cur = cur[k][int(i)]
        else:
            cur = cur.setdefault(k, {})
    cur[keys[-1]] = value
    return doc


@pytest.mark.parametrize("cfg", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_are_valid(cfg):
    assert cfg.read_text().splitlines()[0] == "# yaml-language-server: $schema=./schema.json"
    s = load(cfg, PROVIDERS)
    assert s.control_plane.replicas % 2 == 1
    assert s.version.startswith("v1.")


def test_default_config_shape():
    s = load(ROOT / "configs" / "default.yaml", PROVIDERS)
    assert (s.name, s.namespace, s.provider) == ("kh", "default", "docker")
    assert s.control_plane.name == "kh-control-plane" and s.control_plane.role == "control-plane"
    assert [(w.name, w.replicas) for w in s.workers] == [("kh-md-0", 2)]
    assert s.machine_count == 3
    assert s.minor == 37


@pytest.mark.parametrize("path,value,field,allowed", [
    ("spec.provider.name", "vsphere", "spec.provider.name", "registered providers"),
    ("spec.topology.controlPlane.replicas", 0, "spec.topology.controlPlane.replicas", ">= 1"),
    ("spec.topology.controlPlane.replicas", 2, "spec.topology.controlPlane.replicas", "odd number"),
    ("spec.topology.controlPlane.replicas", "3", "spec.topology.controlPlane.replicas", "integer"),
    ("spec.topology.workers.machineDeployments[0].replicas", 0,
     "spec.topology.workers.machineDeployments[0].replicas", ">= 1"),
    ("spec.topology.version", "1.34", "spec.topology.version", "vMAJOR.MINOR.PATCH"),
    ("spec.topology.version", "v1.20.0", "spec.topology.version", "v1.35.x, v1.36.x, v1.37.x"),
    ("spec.topology.version", "v1.34.4", "spec.topology.version", "v1.35.x, v1.36.x, v1.37.x"),
    ("spec.topology.version", "v1.38.0", "spec.topology.version", "v1.35.x, v1.36.x, v1.37.x"),
    ("spec.topology.version", "v2.37.0", "spec.topology.version", "v1.35.x, v1.36.x, v1.37.x"),
    ("metadata.name", "My_Cluster", "metadata.name", "DNS-1123"),
    ("metadata.namespace", "", "metadata.namespace", "DNS-1123"),
    ("spec.clusterNetwork.pods", "10.96.0.0/12", "spec.clusterNetwork.services", "does not overlap"),
    ("spec.clusterNetwork.pods", "banana", "spec.clusterNetwork.pods", "CIDR"),
    ("spec.clusterNetwork.pods", "10.244.0.0/20", "spec.clusterNetwork.pods", "/16 or larger"),
    ("spec.topology.workers.machineDeployments[0].name", "md_0",
     "spec.topology.workers.machineDeployments[0].name", "DNS-1123"),
    ("spec.topology.replicas", 3, "spec.topology.replicas", "one of the fields"),
    ("spec.kubeadm", {"clusterConfig": {}}, "spec.kubeadm.clusterConfig", "clusterConfiguration"),
    ("apiVersion", "cluster.x-k8s.io/v1beta1", "apiVersion", "harness.k8s.io/v1alpha1"),
    # the docker provider's own options
    ("spec.provider.options", {"cgroupNS": "host"}, "spec.provider.options.cgroupNS", "docker provider's options"),
    ("spec.provider.options", {"cgroupns": "hots"}, "spec.provider.options.cgroupns", "'private', 'host'"),
    ("spec.provider.options", {"privileged": "yes"}, "spec.provider.options.privileged", "'auto', True, False"),
    ("spec.provider.options", {"mtu": 100}, "spec.provider.options.mtu", "576 to 9216"),
    ("spec.provider.options", {"subnet": "172.30.0.1/16"}, "spec.provider.options.subnet", "CIDR"),
    ("spec.provider.options", {"memory": "lots"}, "spec.provider.options.memory", "2g"),
    ("spec.provider.options", {"networks": "kind"}, "spec.provider.options.networks", "list of distinct Docker"),
    ("spec.provider.options", {"networks": ["kind", "kind"]}, "spec.provider.options.networks", "distinct"),
    ("spec.provider.options", {"boot_timeout": True}, "spec.provider.options.boot_timeout", "number"),
    ("spec.provider.options", {"extra_mounts": [{"host_path": "/no/such/dir", "container_path": "/x"}]},
     "spec.provider.options.extra_mounts[0].host_path", "existing path"),
    ("spec.provider.options", {"extra_mounts": [{"host_path": "/tmp", "container_path": "x"}]},
     "spec.provider.options.extra_mounts[0].container_path", "absolute"),
    ("spec.provider.options", {"extra_ports": [{"container_port": 70000}]},
     "spec.provider.options.extra_ports[0].container_port", "1 to 65535"),
    ("spec.provider.options", {"extra_ports": [{"container_port": 80, "protocol": "http"}]},
     "spec.provider.options.extra_ports[0].protocol", "'tcp'"),
    ("spec.provider.options", {"roles": {"workers": {}}}, "spec.provider.options.roles.workers", "control-plane"),
    ("spec.provider.options", {"roles": {"worker": {"memroy": "2g"}}}, "spec.provider.options.roles.worker.memroy",
     "did you mean 'memory'?"),
    ("spec.provider.options", {"extra_ports": [{"contanerPort": 80}]},
     "spec.provider.options.extra_ports[0].contanerPort", "did you mean 'containerPort'?"),
])
def test_bad_field_is_named(path, value, field, allowed):
    with pytest.raises(SpecError) as ei:
        parse(mutate(path, value), "test.yaml", PROVIDERS)
    e = ei.value
    assert e.path == field
    assert allowed in e.allowed
    msg = str(e)
    assert field in msg and repr(e.value) in msg and "test.yaml" in msg


@pytest.mark.parametrize("path,value,field,allowed", [
    # misspelt keys: an error at every level, with a suggestion
    ("spec.topology.controlPlane.replica", 3, "spec.topology.controlPlane.replica", "did you mean 'replicas'?"),
    ("spec.topology.workers.machineDeployments[0].replica", 3,
     "spec.topology.workers.machineDeployments[0].replica", "did you mean 'replicas'?"),
    ("spec.clusterNetwork.pod", "10.1.0.0/16", "spec.clusterNetwork.pod", "did you mean 'pods'?"),
    ("apiversion", API_VERSION, "apiversion", "did you mean 'apiVersion'?"),
    ("status", {}, "status", "one of the fields ['apiVersion', 'kind', 'metadata', 'spec']"),
    ("metadata.nmespace", "x", "metadata.nmespace", "did you mean 'namespace'?"),
    ("metadata.labels", {}, "metadata.labels", "one of the fields ['name', 'namespace']"),
    ("spec.provider.option", {}, "spec.provider.option", "did you mean 'options'?"),
    ("spec.topology.worker", {}, "spec.topology.worker", "did you mean 'workers'?"),
    ("spec.topology.workers.machinedeployments", [], "spec.topology.workers.machinedeployments",
     "did you mean 'machineDeployments'?"),
    ("spec.kubeadm.kubeletConfig", {}, "spec.kubeadm.kubeletConfig", "did you mean 'kubeletConfiguration'?"),
    ("spec.clusterNetwork.serviceDomain", "Cluster.Local", "spec.clusterNetwork.serviceDomain", "DNS domain"),
    ("spec.clusterNetwork.serviceDomain", "cluster..local", "spec.clusterNetwork.serviceDomain", "DNS domain"),
    ("spec.topology.controlPlane.labels", {"a/b/c": "x"}, "spec.topology.controlPlane.labels.a/b/c", "label key"),
    ("spec.topology.controlPlane.labels", {"x" * 64: "x"}, "spec.topology.controlPlane.labels." + "x" * 64,
     "label key"),
    ("spec.topology.workers.machineDeployments[0].labels", {"tier": "-web"},
     "spec.topology.workers.machineDeployments[0].labels.tier", "label value"),
    ("spec.topology.workers.machineDeployments[0].labels", {"tier": 1},
     "spec.topology.workers.machineDeployments[0].labels.tier", "string"),
    ("spec.topology.controlPlane.replicas", True, "spec.topology.controlPlane.replicas", "integer"),
    ("spec.topology.workers.machineDeployments[0].replicas", False,
     "spec.topology.workers.machineDeployments[0].replicas", "integer"),
    ("spec.clusterNetwork.pods", "fd00::/48", "spec.clusterNetwork.pods", "IPv4"),
    ("spec.clusterNetwork.ipFamily", "ipv5", "spec.clusterNetwork.ipFamily", "one of 'ipv4', 'ipv6' or 'dual'"),
    ("spec.clusterNetwork.services", "10.244.128.0/20", "spec.clusterNetwork.services", "does not overlap"),
    ("spec.topology.version", "v1.30.0", "spec.topology.version", "a supported release: v1.35.x"),
    ("spec.kubeadm", {"etcdConfiguration": {}}, "spec.kubeadm.etcdConfiguration", "kubeProxyConfiguration"),
    ("spec.kubeadm.clusterConfiguration", "x", "spec.kubeadm.clusterConfiguration", "mapping"),
])
def test_strict_schema(path, value, field, allowed):
    with pytest.raises(SpecError) as ei:
        parse(mutate(path, value), "bad.yaml", PROVIDERS)
    e = ei.value
    assert (e.path, len(e.errors)) == (field, 1)
    assert allowed in e.allowed
    assert str(e) == f"bad.yaml: invalid {field}: {e.value!r}; allowed: {e.allowed}"


def test_good_labels_and_domain_pass():
    labels = {"example.com/tier": "web", "app.kubernetes.io/name": "", "A_b.c-D": "x" * 63}
    doc = mutate("spec.topology.workers.machineDeployments[0].labels", labels)
    doc["spec"]["clusterNetwork"]["serviceDomain"] = "k8s.example-1.org"
    s = parse(doc, "", PROVIDERS)
    assert s.workers[0].labels == labels and s.service_domain == "k8s.example-1.org"


def test_all_errors_at_once(tmp_path):
    doc = mutate("spec.topology.controlPlane.replica", 3)
    doc["metadata"]["name"] = "Bad_Name"
    doc["spec"]["clusterNetwork"]["pod"] = doc["spec"]["clusterNetwork"].pop("pods")
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError) as ei:
        load(f, PROVIDERS)
    e = ei.value
    assert [x.path for x in e.errors] == ["metadata.name", "spec.clusterNetwork.pod",
                                          "spec.topology.controlPlane.replica"]
    assert (e.path, e.value) == ("metadata.name", "Bad_Name")
    lines = str(e).splitlines()
    assert lines == [str(x) for x in e.errors] and all(x.startswith(f"{f}: invalid ") for x in lines)
    assert "did you mean 'pods'?" in lines[1] and "did you mean 'replicas'?" in lines[2]
    r = subprocess.run([sys.executable, "-m", "harness", "validate", "-c", str(f)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("error: ") == 3, r.stderr


@pytest.mark.parametrize("network,field,allowed", [
    ({"ipFamily": "dual", "pods": "10.244.0.0/16"}, "pods", "two networks: IPv4 and IPv6, IPv4 first (ipFamily dual)"),
    ({"ipFamily": "dual", "pods": ["fd00:10:244::/56", "10.244.0.0/16"]}, "pods", "IPv4 first"),
    ({"ipFamily": "dual", "services": ["10.96.0.0/16", "10.97.0.0/16"]}, "services", "IPv4 and IPv6"),
    ({"ipFamily": "ipv6", "pods": "10.244.0.0/16"}, "pods", "one network: IPv6 (ipFamily ipv6)"),
    ({"ipFamily": "ipv6", "pods": "fd00:10:244::/64"}, "pods", "IPv6 network of /60 or larger"),
    ({"ipFamily": "ipv6", "services": "fd00:10:96::/64"}, "services", "from /108 to /120"),
    ({"ipFamily": "dual", "services": ["10.96.0.0/16", "fd00:10:244::/112"]}, "services",
     "does not overlap pods fd00:10:244::/56"),
    ({"ipFamily": "dual", "pods": ["10.244.0.0/16", "fd00:10:244::/56", "10.1.0.0/16"]}, "pods", "two networks"),
])
def test_ip_family_combinations(network, field, allowed):
    """Networks that do not match spec.clusterNetwork.ipFamily are refused, naming the field."""
    doc = mutate("spec.clusterNetwork", network)
    with pytest.raises(SpecError) as ei:
        parse(doc, "net.yaml", PROVIDERS)
    assert (ei.value.path, len(ei.value.errors)) == (f"spec.clusterNetwork.{field}", 1)
    assert allowed in ei.value.allowed


@pytest.mark.parametrize("network,pods,services", [
    ({"ipFamily": "dual"}, "10.244.0.0/16,fd00:10:244::/56", "10.96.0.0/16,fd00:10:96::/112"),
    ({"ipFamily": "ipv6"}, "fd00:10:244::/56", "fd00:10:96::/112"),
    ({"ipFamily": "ipv6", "pods": "fd00:1::/48", "services": ["fd00:2::/112"]}, "fd00:1::/48", "fd00:2::/112"),
])
def test_ip_family_defaults(network, pods, services):
    s = parse(mutate("spec.clusterNetwork", network), "", PROVIDERS)
    assert (s.pod_cidr, s.service_cidr, s.ip_family) == (pods, services, network["ipFamily"])
    assert s.ip_families == ((4, 6) if network["ipFamily"] == "dual" else (6,))


def test_defaults():
    s = parse({"apiVersion": API_VERSION, "kind": "Cluster", "metadata": {"name": "x"}, "spec": {"topology": {}}},
              "", PROVIDERS)
    assert (s.namespace, s.provider, s.provider_options, s.version) == ("default", "docker", {}, DEFAULT_VERSION)
    assert (s.pod_cidr, s.service_cidr, s.service_domain) == ("10.244.0.0/16", "10.96.0.0/16", "cluster.local")
    assert (s.control_plane.replicas, s.control_plane.labels, s.workers, s.kubeadm_patches) == (1, {}, (), {})


def test_schema_command_matches_committed_copy():
    r = subprocess.run([sys.executable, "-m", "harness", "schema"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout)
    assert printed["additionalProperties"] is False and "Topology" in printed["$defs"]
    assert printed == json.loads((ROOT / "configs" / "schema.json").read_text()), \
        "configs/schema.json is stale: kube-harness schema > configs/schema.json"


def test_good_provider_options_pass():
    opts = {"cgroupns": "host", "privileged": "auto", "mtu": 1400, "subnet": "172.30.0.0/16", "memory": "2g",
            "cpus": 1.5, "env": {"A": "1"}, "extra_mounts": [{"hostPath": "/tmp", "containerPath": "/mnt",
                                                              "propagation": "HostToContainer"}],
            "extra_ports": [{"containerPort": 80, "hostPort": 0, "protocol": "UDP"}],
            "roles": {"worker": {"memory": "1g"}}, "networks": ["kind"]}
    assert parse(mutate("spec.provider.options", opts), "t.yaml", PROVIDERS).provider_options == opts


def test_duplicate_machine_deployment_names():
    doc = base()
    doc["spec"]["topology"]["workers"]["machineDeployments"].append({"name": "md-0", "replicas": 1})
    with pytest.raises(SpecError, match=r"machineDeployments\[1\]\.name.*unique"):
        parse(doc, "", PROVIDERS)


def test_too_many_machines():
    doc = mutate("spec.topology.workers.machineDeployments[0].replicas", 20)
    with pytest.raises(SpecError, match="at most 10 machines"):
        parse(doc, "", PROVIDERS)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(SpecError, match="--cluster-config"):
        load(tmp_path / "nope.yaml", PROVIDERS)
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Cluster\n  metadata: [\n")
    with pytest.raises(SpecError, match="valid YAML"):
        load(bad, PROVIDERS)
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump_all([base(), base()]))
    with pytest.raises(SpecError, match="exactly one document of kind Cluster"):
        load(two, PROVIDERS)


def test_overrides_revalidate():
    s = load(ROOT / "configs" / "default.yaml", PROVIDERS)
    t = s.with_overrides(name="other", version="v1.36.1")
    assert (t.name, t.version, t.control_plane.name) == ("other", "v1.36.1", "other-control-plane")
    assert s.name == "kh"  # original untouched
    with pytest.raises(SpecError, match="spec.topology.version"):
        s.with_overrides(version="latest")


def test_patches_are_kept():
    doc = base()
    doc["spec"]["kubeadm"] = {"clusterConfiguration": {"apiServer": {"extraArgs": [{"name": "v", "value": "2"}]}}}
    s = parse(copy.deepcopy(doc), "", PROVIDERS)
    assert s.kubeadm_patches["clusterConfiguration"]["apiServer"]["extraArgs"][0]["value"] == "2"


def test_cli_validate_reports_field(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text(yaml.safe_dump(mutate("spec.topology.controlPlane.replicas", 4)))
    r = subprocess.run([sys.executable, "-m", "harness", "validate", "-c", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "spec.topology.controlPlane.replicas" in r.stderr and "odd number" in r.stderr
    ok = subprocess.run([sys.executable, "-m", "harness", "validate", "-c", str(ROOT / "configs/default.yaml")],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "default/kh v1.37.2" in ok.stdout
