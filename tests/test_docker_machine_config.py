"""The Docker provider's node container arguments (providers.docker.machine_config)
for given specs, options and host facts: no engine needed."""
from __future__ import annotations

import pytest

from providers.base import L_CLUSTER, L_ROLE, L_RUN, MachineSpec, Owner
from providers.docker.machine_config import HostFacts, machine_config
from providers.docker.options import Mount, Port, resolve

OWNER = Owner(run_id="run-1", pid=42, host="h", started=7)
FULL_HOST = HostFacts(lib_modules=True, kernel_config=None, missing_capabilities=(), devices=("/dev/kmsg",))
SANDBOX = HostFacts(lib_modules=False, kernel_config="/boot/config-6.1", missing_capabilities=("SYS_RESOURCE",),
                    devices=("/dev/kmsg", "/dev/fuse"))


def spec(role: str = "worker", **options) -> MachineSpec:
    return MachineSpec(name=f"c1-{role}-a", cluster="c1", namespace="ns", role=role, deployment=f"c1-{role}",
                       image="kube-harness/node:v1.37.2-x", owner=OWNER, labels={"tier": "t"}, options=options)


def config(role: str = "worker", host: HostFacts = FULL_HOST, **options):
    s = spec(role, **options)
    return machine_config(s, resolve(s.options, role), host)


def test_worker_defaults():
    c = config()
    assert (c.name, c.image, c.volume, c.ports, c.networks) == ("c1-worker-a", "kube-harness/node:v1.37.2-x",
                                                                 "c1-worker-a-var", (), ())
    assert c.labels[L_CLUSTER] == "c1" and c.labels[L_ROLE] == "worker" and c.labels[L_RUN] == "run-1"
    assert c.labels["tier"] == "t"
    assert c.container == {"hostname": "c1-worker-a", "labels": c.labels, "tty": True,
                           "environment": {"container": "docker"}, "stop_signal": "SIGRTMIN+3"}
    assert c.host == {
        "binds": {"c1-worker-a-var": {"bind": "/var", "mode": "rw"},
                  "/lib/modules": {"bind": "/lib/modules", "mode": "ro"}},
        "tmpfs": {"/tmp": "rw,exec,nosuid,nodev", "/run": "rw,exec,nosuid,nodev"},
        "init": False, "restart_policy": {"Name": "on-failure", "MaximumRetryCount": 1}, "cgroupns": "private",
        "privileged": True, "security_opt": ["seccomp=unconfined", "apparmor=unconfined"]}
    assert c.raw_host == {}


def test_control_plane_publishes_the_api_port_and_sets_kubeconfig():
    c = config("control-plane", extra_ports=[{"containerPort": 80, "hostPort": 8080, "protocol": "UDP"},
                                             {"container_port": 443, "listen_address": "0.0.0.0"}])
    assert c.ports == (("6443/tcp", "127.0.0.1", 0), ("80/udp", "127.0.0.1", 8080), ("443/tcp", "0.0.0.0", 0))
    assert c.container["environment"] == {"container": "docker", "KUBECONFIG": "/etc/kubernetes/admin.conf"}


@pytest.mark.parametrize("privileged, host, want_privileged", [
    ("auto", FULL_HOST, True),
    ("auto", SANDBOX, False),  # --privileged cannot start where capabilities are missing
    (True, SANDBOX, True),
    ("true", SANDBOX, True),
    (False, FULL_HOST, False),
])
def test_privilege(privileged, host, want_privileged):
    c = config(host=host, privileged=privileged)
    assert c.host["privileged"] is want_privileged
    assert c.host["security_opt"] == ["seccomp=unconfined", "apparmor=unconfined"]
    if want_privileged:
        assert "cap_add" not in c.host and c.raw_host == {}
        return
    missing = list(host.missing_capabilities) or None
    assert (c.host["cap_add"], c.host["cap_drop"]) == (["ALL"], missing)
    assert c.host["device_cgroup_rules"] == ["a *:* rwm"]
    assert c.host["devices"] == [f"{d}:{d}:rwm" for d in host.devices]
    assert c.raw_host == {"MaskedPaths": [], "ReadonlyPaths": []}  # systempaths=unconfined


def test_mounts_and_host_files(tmp_path):
    mounts = [{"hostPath": str(tmp_path), "containerPath": "/mnt/a", "readOnly": True},
              {"host_path": str(tmp_path / "b"), "container_path": "/mnt/b", "propagation": "HostToContainer"},
              {"host_path": str(tmp_path / "c"), "container_path": "/mnt/c", "propagation": "rshared"},
              {"host_path": str(tmp_path / "d"), "container_path": "/mnt/d", "propagation": "private"}]
    c = config(host=SANDBOX, extra_mounts=mounts)
    assert c.host["binds"] == {
        "c1-worker-a-var": {"bind": "/var", "mode": "rw"},
        "/boot/config-6.1": {"bind": "/boot/config-6.1", "mode": "ro"},  # and no /lib/modules on this host
        str(tmp_path): {"bind": "/mnt/a", "mode": "ro"},
        str(tmp_path / "b"): {"bind": "/mnt/b", "mode": "rw,rslave"},
        str(tmp_path / "c"): {"bind": "/mnt/c", "mode": "rw,rshared"},
        str(tmp_path / "d"): {"bind": "/mnt/d", "mode": "rw"}}


def test_role_options_override_the_top_level_ones():
    options = {"memory": "1g", "cpus": 1, "env": {"A": 1}, "cgroupns": "host", "networks": ["kind"],
               "roles": {"worker": {"memory": "2g", "cpus": 1.5, "env": {"B": "x"}, "privileged": False}}}
    worker, cp = config(**options), config("control-plane", **options)
    assert (worker.host["mem_limit"], worker.host["nano_cpus"]) == ("2g", 1_500_000_000)
    assert (cp.host["mem_limit"], cp.host["nano_cpus"]) == ("1g", 1_000_000_000)
    assert worker.container["environment"] == {"container": "docker", "B": "x"}  # the role's env replaces
    assert cp.container["environment"] == {"container": "docker", "A": "1", "KUBECONFIG": "/etc/kubernetes/admin.conf"}
    assert worker.host["privileged"] is False and cp.host["privileged"] is True
    assert worker.host["cgroupns"] == cp.host["cgroupns"] == "host"
    assert worker.networks == cp.networks == ("kind",)


def test_resolved_options():
    o = resolve({"extra_mounts": [{"hostPath": "rel", "containerPath": "/x"}],
                 "extra_ports": [{"containerPort": "8080"}], "stop_timeout": 5,
                 "roles": {"control-plane": {"boot_timeout": 300, "wait": False}}}, "control-plane")
    assert o.extra_mounts[0] == Mount(host_path=o.extra_mounts[0].host_path, container_path="/x")
    assert o.extra_mounts[0].host_path.endswith("/rel") and o.extra_mounts[0].host_path.startswith("/")
    assert o.extra_ports == (Port(container_port=8080),)
    assert (o.stop_timeout, o.boot_timeout, o.wait, o.mtu, o.privileged) == (5, 300.0, False, 1500, "auto")
    assert resolve({}).boot_timeout == 120 and resolve(None).cgroupns == "private"


def test_load_balancer_is_not_a_node():
    with pytest.raises(ValueError, match="not a node role"):
        config("load-balancer")


def test_ipv6_network_sysctls():
    """On a network with IPv6 the node has it enabled and forwards it (dual-stack and IPv6 clusters)."""
    s = spec()
    assert "sysctls" not in machine_config(s, resolve(s.options, "worker"), FULL_HOST).host
    c = machine_config(s, resolve(s.options, "worker"), FULL_HOST, ipv6=True)
    assert c.host["sysctls"] == {"net.ipv6.conf.all.disable_ipv6": "0", "net.ipv6.conf.all.forwarding": "1"}
