"""A node container's create arguments as a pure function of the MachineSpec, its
role's resolved options and facts about the host (like kind's runArgsForNode):
labels, the ``/var`` volume and bind mounts, published ports, privilege, environment,
cgroup namespace and resource limits. No engine calls."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from providers.base import MachineSpec

from .options import DockerOptions

API_PORT = 6443
NODE_ROLES = ("control-plane", "worker")
#: bind propagation Docker knows, by the names kind's config uses too
PROPAGATION = {"rshared": "rshared", "rslave": "rslave", "Bidirectional": "rshared", "HostToContainer": "rslave"}
SECURITY_OPT = ["seccomp=unconfined", "apparmor=unconfined"]


def volume_name(machine: str) -> str:
    return f"{machine}-var"


@dataclass(frozen=True)
class HostFacts:
    """What of the host goes into a node: read by :func:`providers.docker.host.host_facts`."""
    lib_modules: bool = True  # /lib/modules exists: mounted read-only
    kernel_config: str | None = None  # /boot/config-<release> to mount (kubeadm's SystemVerification)
    missing_capabilities: tuple[str, ...] = ()  # what --privileged cannot grant on this host and engine
    devices: tuple[str, ...] = ()  # of /dev/kmsg, /dev/fuse, /dev/net/tun: those that exist


@dataclass(frozen=True)
class MachineConfig:
    """The engine calls' arguments: ``create_container(image, **container)``,
    ``create_host_config(**host)`` plus ``raw_host`` (fields docker-py has no keyword for)."""
    name: str
    image: str
    labels: dict[str, str]  # of the container and its volume
    volume: str  # the named volume on /var, labelled as the machine
    ports: tuple[tuple[str, str, int], ...]  # (container "port/proto", listen address, host port; 0: free)
    networks: tuple[str, ...]  # more networks to join, besides the cluster's
    container: dict[str, Any] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    raw_host: dict[str, Any] = field(default_factory=dict)


def machine_config(spec: MachineSpec, opts: DockerOptions, host: HostFacts, ipv6: bool = False) -> MachineConfig:
    """``ipv6``: the cluster network has IPv6 (the node gets it, and forwards it, as kind's nodes)."""
    if spec.role not in NODE_ROLES:
        raise ValueError(f"{spec.name}: role {spec.role!r} is not a node role")
    labels = spec.all_labels()
    env = {"container": "docker", **opts.env}
    if spec.role == "control-plane":
        env.setdefault("KUBECONFIG", "/etc/kubernetes/admin.conf")
    volume = volume_name(spec.name)
    binds = _binds(volume, opts, host)
    ports = [(f"{API_PORT}/tcp", "127.0.0.1", 0)] if spec.role == "control-plane" else []
    ports += [(f"{p.container_port}/{p.protocol}", p.listen_address, p.host_port) for p in opts.extra_ports]
    host_config: dict[str, Any] = dict(
        binds=binds, tmpfs={"/tmp": "rw,exec,nosuid,nodev", "/run": "rw,exec,nosuid,nodev"},
        init=False, restart_policy={"Name": "on-failure", "MaximumRetryCount": 1}, cgroupns=opts.cgroupns)
    if opts.memory:
        host_config["mem_limit"] = opts.memory
    if opts.cpus:
        host_config["nano_cpus"] = int(opts.cpus * 1e9)
    if ipv6:
        host_config["sysctls"] = {"net.ipv6.conf.all.disable_ipv6": "0", "net.ipv6.conf.all.forwarding": "1"}
    privilege, raw_host = _privilege(opts, host)
    host_config.update(privilege)
    container = dict(hostname=spec.name, labels=labels, tty=True, environment=env, stop_signal="SIGRTMIN+3")
    return MachineConfig(name=spec.name, image=spec.image, labels=labels, volume=volume, ports=tuple(ports),
                         networks=opts.networks, container=container, host=host_config, raw_host=raw_host)


def _binds(volume: str, opts: DockerOptions, host: HostFacts) -> dict[str, dict[str, str]]:
    binds = {volume: {"bind": "/var", "mode": "rw"}}
    if host.lib_modules:
        binds["/lib/modules"] = {"bind": "/lib/modules", "mode": "ro"}
    if host.kernel_config:
        binds[host.kernel_config] = {"bind": host.kernel_config, "mode": "ro"}
    for m in opts.extra_mounts:
        mode = "ro" if m.readonly else "rw"
        if m.propagation in PROPAGATION:
            mode += "," + PROPAGATION[m.propagation]
        binds[m.host_path] = {"bind": m.container_path, "mode": mode}
    return binds


def _privilege(opts: DockerOptions, host: HostFacts) -> tuple[dict[str, Any], dict[str, Any]]:
    """Host config for a node: --privileged, or its emulation where the
    host cannot grant every capability (see the ``privileged`` option)."""
    missing = list(host.missing_capabilities)
    if opts.privileged is True or (opts.privileged == "auto" and not missing):
        return {"privileged": True, "security_opt": list(SECURITY_OPT)}, {}
    devices = [f"{d}:{d}:rwm" for d in host.devices]
    config = {"privileged": False, "cap_add": ["ALL"], "cap_drop": missing or None, "security_opt": list(SECURITY_OPT),
              "device_cgroup_rules": ["a *:* rwm"], "devices": devices or None}
    # what `--security-opt systempaths=unconfined` sends: no masked or
    # read-only /proc paths (kubelet and kube-proxy write /proc/sys)
    return config, {"MaskedPaths": [], "ReadonlyPaths": []}
