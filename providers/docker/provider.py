"""Docker machine provider: machines are privileged systemd containers on a
per-cluster bridge network, as kind and Cluster API's CAPD run them.

Objects and names
-----------------
* network ``kh-<namespace>-<cluster>`` (user-defined bridge: embedded DNS,
  machines resolve each other by name), labelled with ``owner_labels``;
* machine = container named ``spec.name`` (hostname too), labelled with
  ``spec.all_labels()``, with a named volume ``<name>-var`` on ``/var``
  carrying the same labels (the image's ``/var`` is copied into it on first
  use; containerd's overlayfs snapshotter cannot run on the container's own
  overlay root);
* load balancer = container ``<cluster>-lb`` (role ``load-balancer``)
  running haproxy from the base image.

Everything is found again by labels: no state file, safe across processes.

Provider options (``spec.provider.options``; they also arrive as
``MachineSpec.options`` and as keywords of ``node_image``):

``image``
    node image to boot (``node_image`` returns it).
``cgroupns``
    ``"private"`` (default, as kind: the node gets its own cgroup namespace,
    also on a cgroup v1 host) or ``"host"`` (the entrypoint then applies
    kind's cgroup v1 fix-ups).
``boot_timeout``
    seconds to wait for systemd (default 120).
``wait``
    ``create_machine`` waits until systemd is up (default true).
``stop_timeout``
    seconds ``stop_machine`` gives systemd to halt before SIGKILL (default 30).
``subnet`` / ``mtu``
    of the cluster network (default: Docker picks a free subnet; MTU 1500).
``ipv6_subnet``
    the cluster network's IPv6 subnet when the cluster's ipFamily is ipv6 or
    dual (default: a ULA /64 derived from the network's name).
``extra_mounts``
    list of ``{"host_path", "container_path", "readonly": false,
    "propagation": "private|rslave|rshared"}`` (camelCase ``hostPath`` /
    ``containerPath`` as in kind's config are accepted too).
``networks``
    more Docker networks every node joins (made if missing, shared, never
    deleted with a cluster), e.g. ``["kind"]`` for a management cluster
    whose CAPD puts workload clusters on CAPD's network "kind".
``extra_ports``
    list of ``{"container_port", "host_port": 0, "listen_address":
    "127.0.0.1", "protocol": "tcp"}``; host_port 0 picks a free port.
``env``
    extra environment variables for the node's entrypoint/systemd.
``memory`` / ``cpus``
    resource limits (docker syntax: ``"2g"``, ``1.5``).
``roles``
    ``{"control-plane": {...}, "worker": {...}}``: any of the options above
    for machines of one role only (merged over the top-level ones).
``lb_image``
    image of the load balancer container (default: the base image).
``privileged``
    ``"auto"`` (default): ``--privileged``, as kind and CAPD. Only a Docker
    engine older than 23 on a host whose root lacks capabilities cannot
    start privileged containers at all (it asks runc for every capability;
    23+ grants the daemon's bounding set); there, as a fallback, nodes get
    every capability the host has, unconfined seccomp/apparmor and system
    paths, access to all devices and /dev/kmsg, and the entrypoint remounts
    the cgroup hierarchies read-write. ``true`` / ``false`` force either way.

Options are checked when the spec is loaded (:mod:`providers.docker.options`):
an unknown key or a bad value fails naming ``spec.provider.options.<key>``.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import logging
import os
import select
import signal
import socket
import struct
import tarfile
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import docker
import psutil
import requests
from docker import errors as derr

from providers.base import (L_CLUSTER, L_DEPLOYMENT, L_NAMESPACE, L_ROLE, ExecError, ExecResult, Health,
                            Machine, MachineProvider, MachineSpec, Owner, ProviderError, owner_labels)

log = logging.getLogger("harness.provider.docker")

API_PORT = 6443
HAPROXY_CFG = "/usr/local/etc/haproxy/haproxy.cfg"
HAPROXY_CMD = ["haproxy", "-W", "-db", "-f", HAPROXY_CFG]


class EngineUnavailable(ProviderError):
    """The Docker engine does not answer."""


def engine_guarded(method):
    """A provider method whose lost engine connection is an :class:`EngineUnavailable`."""
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (requests.exceptions.ConnectionError, ConnectionError) as e:
            what = method.__name__.lstrip("_")
            if args and isinstance(args[0], Machine):  # "<machine>: exec <command>"
                cmd = args[1] if len(args) > 1 and isinstance(args[1], list) and args[1] else None
                what = f"{args[0].name}: " + (f"exec {cmd[0]}" if cmd else what)
            raise EngineUnavailable(f"{what}: the Docker engine does not answer ({self.api.base_url}); "
                                    f"was it stopped or restarted? ({e})") from e
    return guarded


class ExecTimeout(ProviderError, TimeoutError):
    """A command did not finish within its timeout (it was killed)."""

    def __init__(self, machine: str, cmd: Sequence[str], timeout: float, partial: ExecResult):
        self.machine, self.cmd, self.timeout, self.result = machine, list(cmd), timeout, partial
        super().__init__(f"{machine}: {' '.join(cmd)} did not finish within {timeout:.0f}s")


def network_name(cluster: str, namespace: str) -> str:
    return f"kh-{namespace}-{cluster}"


def ula_subnet(network: str) -> str:
    """A unique local IPv6 /64 for a network, derived from its name."""
    h = hashlib.sha256(network.encode()).hexdigest()
    return f"fd{h[:2]}:{h[2:6]}:{h[6:10]}:{h[10:14]}::/64"


def lb_name(cluster: str) -> str:
    return f"{cluster}-lb"


def volume_name(machine: str) -> str:
    return f"{machine}-var"


# capability numbers -> names, as far as Docker 20.10 knows them (0..37)
_CAPS = ("CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE "
         "NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT "
         "SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE "
         "AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ").split()


def missing_capabilities() -> list[str]:
    """Capabilities this host's root lacks (sandboxed hosts, e.g. no
    CAP_SYS_RESOURCE). ``--privileged`` asks runc for all of them and fails
    there ("unable to apply caps"), so nodes then get everything else."""
    try:
        status = Path("/proc/self/status").read_text()
        bnd = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("CapBnd:")), 16)
    except (OSError, StopIteration, ValueError):
        return []
    return [name for i, name in enumerate(_CAPS) if not bnd >> i & 1]


def _free_port(address: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _port_conflict(e: Exception) -> bool:
    m = str(e).lower()
    return "port is already allocated" in m or "address already in use" in m or "bind for" in m


class DockerProvider(MachineProvider):
    name = "docker"

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        from .options import validate
        validate(options)

    def __init__(self, options: Mapping[str, Any] | None = None):
        super().__init__(options)
        self._client: docker.DockerClient | None = None
        self._engine_version: str | None = None

    # ------------------------------------------------------------------ client
    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            try:
                self._client = docker.from_env(timeout=300, max_pool_size=32)
                self._client.ping()
            except Exception as e:
                self._client = None
                raise ProviderError(f"cannot reach the Docker engine ({os.environ.get('DOCKER_HOST') or 'unix:///var/run/docker.sock'}): {e}") from e
        return self._client

    @property
    def api(self) -> docker.APIClient:
        return self.client.api

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # ---------------------------------------------------------- infrastructure
    def _networks(self, name: str) -> list[dict]:
        """Networks with exactly this name, oldest first (Docker allows duplicates)."""
        nets = [n for n in self.api.networks(names=[name]) if n.get("Name") == name]
        return sorted(nets, key=lambda n: (n.get("Created", ""), n["Id"]))

    def _network(self, cluster: str, namespace: str) -> dict | None:
        nets = self._networks(network_name(cluster, namespace))
        return nets[0] if nets else None

    def ensure_infrastructure(self, cluster: str, namespace: str, owner: Owner,
                              ip_families: Sequence[int] = (4,)) -> None:
        net = self._ensure_network(cluster, namespace, owner, ipv6=6 in ip_families)
        if 6 in ip_families and not net.get("EnableIPv6"):
            raise ProviderError(f"network {net['Name']} exists without IPv6, which the cluster's IP family needs; "
                                f"delete the cluster first (`kube-harness down {cluster} -n {namespace}`)")

    def _ensure_network(self, cluster: str, namespace: str, owner: Owner, ipv6: bool = False) -> dict:
        name = network_name(cluster, namespace)
        net = self._network(cluster, namespace)
        if net is not None:
            return net
        with self._host_lock(f"network-{name}"):
            net = self._network(cluster, namespace)
            if net is not None:
                return net
            opts = {"com.docker.network.bridge.enable_ip_masquerade": "true",
                    "com.docker.network.driver.mtu": str(self.options.get("mtu", 1500))}
            pools = [docker.types.IPAMPool(subnet=self.options["subnet"])] if self.options.get("subnet") else []
            if ipv6:
                pools.append(docker.types.IPAMPool(subnet=self.options.get("ipv6_subnet") or ula_subnet(name)))
            ipam = docker.types.IPAMConfig(pool_configs=pools) if pools else None
            try:
                self.api.create_network(name, driver="bridge", labels=owner_labels(cluster, namespace, owner),
                                        options=opts, ipam=ipam, check_duplicate=True, enable_ipv6=ipv6)
                log.info(f"created network {name}", extra={"cluster": cluster, "phase": "infrastructure"})
            except derr.APIError as e:
                if e.status_code != 409 and "already exists" not in str(e):
                    raise ProviderError(f"creating network {name}: {e}") from e
        # another host/process may still have raced us past the lock: keep the
        # oldest network of that name, remove the others while still empty
        nets = self._networks(name)
        for extra in nets[1:]:
            with contextlib.suppress(derr.APIError):
                if not self.api.inspect_network(extra["Id"]).get("Containers"):
                    self.api.remove_network(extra["Id"])
        if not nets:
            raise ProviderError(f"network {name} vanished right after creation")
        return nets[0]

    def _ensure_shared_network(self, name: str) -> str:
        """A network machines of any cluster may join (option ``networks``, e.g. CAPD's
        "kind"): made if missing, owned by no cluster, so never deleted with one."""
        with self._host_lock(f"network-{name}"):
            found = self.api.networks(names=[name])
            found = [n for n in found if n["Name"] == name]
            if found:
                return found[0]["Id"]
            opts = {"com.docker.network.bridge.enable_ip_masquerade": "true",
                    "com.docker.network.driver.mtu": str(self.options.get("mtu", 1500))}
            log.info(f"created shared network {name}", extra={"phase": "infrastructure"})
            return self.api.create_network(name, driver="bridge", options=opts)["Id"]

    def _connect(self, container: str, name: str, networks: list[str]) -> None:
        for n in networks:
            self.api.connect_container_to_network(container, n, aliases=[name])

    @contextlib.contextmanager
    def _host_lock(self, what: str) -> Iterator[None]:
        from filelock import FileLock
        from providers.docker.nodeimage.base import cache_dir
        d = cache_dir() / "locks"
        d.mkdir(parents=True, exist_ok=True)
        with FileLock(str(d / f"{what}.lock"), timeout=120):
            yield

    def delete_infrastructure(self, cluster: str, namespace: str) -> None:
        sel = {L_CLUSTER: cluster, L_NAMESPACE: namespace, L_ROLE: "load-balancer"}
        for c in self._containers(sel):
            self._remove_container(c["Id"], c["Names"][0].lstrip("/"))
        name = network_name(cluster, namespace)
        for net in self._networks(name):
            try:
                self.api.remove_network(net["Id"])
            except derr.NotFound:
                pass
            except derr.APIError as e:
                attached = [c.get("Name") for c in (self.api.inspect_network(net["Id"]).get("Containers") or {}).values()]
                raise ProviderError(f"network {name} still has containers {attached}; delete the machines first") from e

    # ------------------------------------------------------------- machines
    def _machine_options(self, spec: MachineSpec) -> dict[str, Any]:
        opts = {**self.options, **dict(spec.options or {})}
        per_role = (opts.get("roles") or {}).get(spec.role) or {}
        return {**opts, **per_role}

    def create_machine(self, spec: MachineSpec) -> Machine:
        if spec.role not in ("control-plane", "worker"):
            raise ProviderError(f"{spec.name}: role {spec.role!r} is not a node role; "
                                "use ensure_load_balancer for load balancers")
        opts = self._machine_options(spec)
        net = self._ensure_network(spec.cluster, spec.namespace, spec.owner)
        labels = spec.all_labels()
        vol = self._fresh_volume(volume_name(spec.name), labels)
        env = {"container": "docker", **{str(k): str(v) for k, v in (opts.get("env") or {}).items()}}
        if spec.role == "control-plane":
            env.setdefault("KUBECONFIG", "/etc/kubernetes/admin.conf")
        volumes: dict[str, dict] = {vol: {"bind": "/var", "mode": "rw"}}
        if os.path.isdir("/lib/modules"):
            volumes["/lib/modules"] = {"bind": "/lib/modules", "mode": "ro"}
        # kubeadm's SystemVerification reads the kernel config: /proc/config.gz or this file
        kconfig = f"/boot/config-{os.uname().release}"
        if self._local_engine() and os.path.isfile(kconfig) and not os.path.exists("/proc/config.gz"):
            volumes[kconfig] = {"bind": kconfig, "mode": "ro"}
        for m in opts.get("extra_mounts") or []:
            hp = os.path.abspath(m.get("host_path") or m.get("hostPath"))
            cp = m.get("container_path") or m.get("containerPath")
            mode = "ro" if m.get("readonly") or m.get("readOnly") else "rw"
            prop = m.get("propagation")
            if prop in ("rshared", "rslave", "Bidirectional", "HostToContainer"):
                mode += "," + {"Bidirectional": "rshared", "HostToContainer": "rslave"}.get(prop, prop)
            volumes[hp] = {"bind": cp, "mode": mode}
        ports_spec: list[tuple[str, str, int]] = []  # (container "port/proto", listen address, host port)
        if spec.role == "control-plane":
            ports_spec.append((f"{API_PORT}/tcp", "127.0.0.1", 0))
        for p in opts.get("extra_ports") or []:
            ports_spec.append((f"{int(p.get('container_port') or p.get('containerPort'))}/{p.get('protocol', 'tcp').lower()}",
                               p.get("listen_address") or p.get("listenAddress") or "127.0.0.1",
                               int(p.get("host_port") or p.get("hostPort") or 0)))
        host: dict[str, Any] = dict(
            binds=volumes, tmpfs={"/tmp": "rw,exec,nosuid,nodev", "/run": "rw,exec,nosuid,nodev"},
            init=False, restart_policy={"Name": "on-failure", "MaximumRetryCount": 1},
            cgroupns=opts.get("cgroupns", "private"),
        )
        if opts.get("memory"):
            host["mem_limit"] = opts["memory"]
        if opts.get("cpus"):
            host["nano_cpus"] = int(float(opts["cpus"]) * 1e9)
        if net.get("EnableIPv6"):  # as kind: IPv6 on, and nodes route pod traffic
            host["sysctls"] = {"net.ipv6.conf.all.disable_ipv6": "0", "net.ipv6.conf.all.forwarding": "1"}
        priv, raw_host = self._privilege(opts)
        host.update(priv)
        container = dict(hostname=spec.name, labels=labels, tty=True, environment=env, stop_signal="SIGRTMIN+3")
        try:
            extra = [self._ensure_shared_network(n) for n in opts.get("networks") or []]
            self._create_and_start(spec.name, spec.image, net["Id"], ports_spec, container, host, raw_host,
                                   before_start=lambda cid: self._connect(cid, spec.name, extra))
        except BaseException:
            with contextlib.suppress(Exception):
                if self.get_machine(spec.name) is None:  # nothing uses it: do not leave it behind
                    self._remove_volume(vol)
            raise
        m = self.get_machine(spec.name)
        if m is None:
            raise ProviderError(f"{spec.name}: container vanished after start")
        log.info(f"machine {spec.name} started ({spec.role}, {m.ip})",
                 extra={"cluster": spec.cluster, "machine": spec.name, "phase": "machine-start"})
        if opts.get("wait", True):
            self.wait_booted(m, timeout=float(opts.get("boot_timeout", 120)))
            m = self.get_machine(spec.name) or m
        return m

    def _privilege(self, opts: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Host config for a node: --privileged, or its emulation where the
        host cannot grant every capability (see ``privileged`` option)."""
        mode = opts.get("privileged", "auto")
        missing = missing_capabilities() if self._local_engine() and self._engine_major() < 23 else []
        if mode is True or mode == "true" or (mode == "auto" and not missing):
            return {"privileged": True, "security_opt": ["seccomp=unconfined", "apparmor=unconfined"]}, {}
        devices = [f"{d}:{d}:rwm" for d in ("/dev/kmsg", "/dev/fuse", "/dev/net/tun") if os.path.exists(d)]
        host = {"privileged": False, "cap_add": ["ALL"], "cap_drop": missing or None,
                "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
                "device_cgroup_rules": ["a *:* rwm"], "devices": devices or None}
        # what `--security-opt systempaths=unconfined` sends: no masked or
        # read-only /proc paths (kubelet and kube-proxy write /proc/sys)
        return host, {"MaskedPaths": [], "ReadonlyPaths": []}

    def _fresh_volume(self, name: str, labels: Mapping[str, str]) -> str:
        """Create the machine's /var volume; a leftover of a deleted machine
        with the same name is removed first (it would carry its state)."""
        try:
            self.api.inspect_volume(name)
            try:
                self.api.remove_volume(name)
            except derr.APIError as e:
                raise ProviderError(f"volume {name} exists and is in use: {e}") from e
        except derr.NotFound:
            pass
        self.api.create_volume(name, driver="local", labels=dict(labels))
        return name

    def _create_and_start(self, name: str, image: str, network: str, ports_spec: list[tuple[str, str, int]],
                          container: dict[str, Any], host: dict[str, Any], raw_host: dict[str, Any] | None = None,
                          before_start: Any = None, attempts: int = 5) -> str:
        """Create and start a container on ``network``; returns its id.
        Host ports given as 0 are picked here (and so stay the same across
        restarts, as kind does); a collision with another process retries."""
        for attempt in range(attempts):
            bindings: dict[str, tuple[str, int]] = {}
            exposed: list[tuple[int, str]] = []
            for cport, addr, hport in ports_spec:
                bindings[cport] = (addr, hport or _free_port(addr))
                num, _, proto = cport.partition("/")
                exposed.append((int(num), proto or "tcp"))
            hc = self.api.create_host_config(port_bindings=bindings or None, network_mode=network, **host)
            hc.update(raw_host or {})
            nc = self.api.create_networking_config({network: self.api.create_endpoint_config(aliases=[name])})
            try:
                cid = self.api.create_container(image, name=name, host_config=hc, networking_config=nc,
                                                ports=exposed or None, **container)["Id"]
            except derr.ImageNotFound as e:
                raise ProviderError(f"{name}: image {image!r} not found (build it first)") from e
            except derr.APIError as e:
                if e.status_code == 409:
                    raise ProviderError(f"{name}: a container of that name already exists") from e
                raise ProviderError(f"{name}: creating container: {e.explanation or e}") from e
            try:
                if before_start is not None:
                    before_start(cid)
                self.api.start(cid)
                return cid
            except derr.APIError as e:
                with contextlib.suppress(derr.APIError):
                    self.api.remove_container(cid, force=True, v=True)
                if _port_conflict(e) and attempt < attempts - 1 and any(h == 0 for _, _, h in ports_spec):
                    log.debug(f"{name}: host port collision, retrying: {e}")
                    continue
                raise ProviderError(f"{name}: starting container: {e.explanation or e}") from e
            except BaseException:
                with contextlib.suppress(derr.APIError):
                    self.api.remove_container(cid, force=True, v=True)
                raise
        raise ProviderError(f"{name}: no free host port after {attempts} attempts")

    def _remove_container(self, cid: str, name: str) -> list[str]:
        """Force-remove a container and its volumes; returns what was deleted."""
        deleted: list[str] = []
        vols: list[str] = []
        try:
            info = self.api.inspect_container(cid)
            vols = [m["Name"] for m in info.get("Mounts", []) if m.get("Type") == "volume" and m.get("Name")]
        except derr.NotFound:
            pass
        try:
            self.api.remove_container(cid, force=True, v=True)
            deleted.append(f"machine/{name}")
        except derr.NotFound:
            pass
        except derr.APIError as e:
            if "removal of container" in str(e) and "already in progress" in str(e):
                self._wait_gone(cid)
            else:
                raise ProviderError(f"removing container {name}: {e}") from e
        for v in vols:
            if self._remove_volume(v):
                deleted.append(f"volume/{v}")
        return deleted

    def _wait_gone(self, cid: str, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                self.api.inspect_container(cid)
            except derr.NotFound:
                return
            time.sleep(0.2)

    def _remove_volume(self, name: str) -> bool:
        for _ in range(20):
            try:
                self.api.remove_volume(name, force=True)
                return True
            except derr.NotFound:
                return False
            except derr.APIError as e:
                if e.status_code == 409:  # still in use while its container goes away
                    time.sleep(0.25)
                    continue
                raise ProviderError(f"removing volume {name}: {e}") from e
        raise ProviderError(f"volume {name} stays in use")

    def delete_machine(self, machine: Machine) -> None:
        self._remove_container(machine.name, machine.name)
        self._remove_volume(volume_name(machine.name))
        log.info(f"deleted machine {machine.name}", extra={"machine": machine.name, "phase": "machine-delete"})

    def _containers(self, selector: Mapping[str, str] | None = None, all: bool = True) -> list[dict]:
        filters = [L_CLUSTER] + [f"{k}={v}" for k, v in (selector or {}).items()]
        return self.api.containers(all=all, filters={"label": filters})

    def _to_machine(self, c: Mapping[str, Any]) -> Machine:
        """From a container summary (list) or inspect document."""
        if "Names" in c:  # summary
            name = c["Names"][0].lstrip("/")
            labels = c.get("Labels") or {}
            status = c.get("State", "")
        else:
            name = c["Name"].lstrip("/")
            labels = c["Config"].get("Labels") or {}
            status = c["State"]["Status"]
        nets = (c.get("NetworkSettings") or {}).get("Networks") or {}
        own = network_name(labels.get(L_CLUSTER, ""), labels.get(L_NAMESPACE, ""))
        order = sorted(nets, key=lambda n: (n != own, n))
        addrs = tuple(nets[n][key] for key in ("IPAddress", "GlobalIPv6Address") for n in order if nets[n].get(key))
        state = {"running": "running", "exited": "stopped", "created": "stopped", "dead": "stopped"}.get(status, status)
        return Machine(name=name, cluster=labels.get(L_CLUSTER, ""), namespace=labels.get(L_NAMESPACE, ""),
                       role=labels.get(L_ROLE, ""), deployment=labels.get(L_DEPLOYMENT, ""),
                       provider_id=f"docker:////{name}", state=state, addresses=addrs, labels=dict(labels))

    def list_machines(self, cluster: str | None = None, namespace: str | None = None,
                      selector: Mapping[str, str] | None = None) -> list[Machine]:
        sel = dict(selector or {})
        if cluster:
            sel[L_CLUSTER] = cluster
        if namespace:
            sel[L_NAMESPACE] = namespace
        out = [self._to_machine(c) for c in self._containers(sel) if L_ROLE in (c.get("Labels") or {})]
        return sorted(out, key=lambda m: m.name)

    def get_machine(self, name: str) -> Machine | None:
        try:
            info = self.api.inspect_container(name)
        except derr.NotFound:
            return None
        labels = info["Config"].get("Labels") or {}
        if L_CLUSTER not in labels or L_ROLE not in labels:
            return None  # not ours
        return self._to_machine(info)

    # --------------------------------------------------------------- exec
    def exec(self, machine: Machine, cmd: Sequence[str], *, input: bytes | None = None,
             check: bool = True, timeout: float | None = None, env: Mapping[str, str] | None = None) -> ExecResult:
        cmd = [str(c) for c in cmd]
        code, out, err = self._exec_bytes(machine, cmd, input, timeout, env)
        res = ExecResult(code, _dec(out), _dec(err))
        if check and res.exit_code != 0:
            raise ExecError(machine.name, cmd, res)
        return res

    @engine_guarded
    def _exec_bytes(self, machine: Machine, cmd: list[str], input: bytes | str | None = None,
                    timeout: float | None = None, env: Mapping[str, str] | None = None) -> tuple[int, bytes, bytes]:
        if isinstance(input, str):
            input = input.encode()
        try:
            ex = self.api.exec_create(machine.name, cmd, stdout=True, stderr=True, stdin=input is not None,
                                      tty=False, environment=dict(env) if env else None)
        except derr.NotFound as e:
            raise ProviderError(f"{machine.name}: no such machine") from e
        except derr.APIError as e:
            raise ProviderError(f"{machine.name}: exec {cmd[0]}: {e.explanation or e}{self._why_stopped(machine)}") from e
        out, err, timed_out = self._exec_stream(ex["Id"], input, timeout)
        if timed_out:
            self._kill_exec(ex["Id"])
            raise ExecTimeout(machine.name, cmd, timeout or 0, ExecResult(-1, _dec(out), _dec(err)))
        for _ in range(100):
            info = self.api.exec_inspect(ex["Id"])
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"]), out, err
            time.sleep(0.05)
        return -1, out, err

    def _exec_stream(self, exec_id: str, input: bytes | None, timeout: float | None) -> tuple[bytes, bytes, bool]:
        """Attach to an exec: write input (then half-close), read the
        multiplexed stdout/stderr until EOF or the deadline."""
        sock, pending = self._hijack(f"/exec/{exec_id}/start", {"Detach": False, "Tty": False})
        deadline = None if timeout is None else time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        buf = bytearray(pending)
        to_send = memoryview(input or b"")
        sent = 0
        wr_open = input is not None
        if not wr_open:
            _shutdown_write(sock)
        try:
            sock.setblocking(False)
            eof = False
            while not eof:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    return bytes(out), bytes(err), True
                r, w, _ = select.select([sock], [sock] if wr_open else [], [], min(wait, 1.0) if wait else 1.0)
                if w and wr_open:
                    try:
                        sent += sock.send(to_send[sent:sent + 65536])
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:  # process closed its stdin
                        sent = len(to_send)
                    if sent >= len(to_send):
                        _shutdown_write(sock)
                        wr_open = False
                if r:
                    try:
                        chunk = sock.recv(65536)
                    except (BlockingIOError, InterruptedError):
                        chunk = None
                    if chunk == b"":
                        eof = True
                    elif chunk:
                        buf += chunk
                # demultiplex complete frames: [stream, 0, 0, 0, size(4, big endian)] payload
                while len(buf) >= 8:
                    stream, size = buf[0], struct.unpack(">I", bytes(buf[4:8]))[0]
                    if len(buf) < 8 + size:
                        break
                    (err if stream == 2 else out).extend(buf[8:8 + size])
                    del buf[:8 + size]
            return bytes(out), bytes(err), False
        finally:
            with contextlib.suppress(OSError):
                sock.close()

    def _hijack(self, path: str, body: Mapping[str, Any]) -> tuple[socket.socket, bytes]:
        """POST to the engine and take over the connection (what ``docker
        exec`` does), returning the raw socket and bytes already read past
        the response headers."""
        base = self.api.base_url
        data = json.dumps(body).encode()
        version = self.api.api_version
        if base.startswith("http+docker://localhost") or base.startswith("http+unix://"):
            addr = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(addr[len("unix://"):] if addr.startswith("unix://") else "/var/run/docker.sock")
        elif base.startswith("http://"):
            host, _, port = base[len("http://"):].partition(":")
            sock = socket.create_connection((host, int(port or 2375)))
        else:  # tls / ssh / npipe: let docker-py do the hijack
            s = self.api.exec_start(path.split("/")[2], socket=True)
            raw = getattr(s, "_sock", s)
            return raw, b""
        req = (f"POST /v{version}{path} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\n"
               f"Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data
        sock.sendall(req)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                sock.close()
                raise ProviderError(f"docker engine closed the connection on {path}")
            head += chunk
        header, _, rest = head.partition(b"\r\n\r\n")
        status = int(header.split(b" ", 2)[1])
        if status not in (101, 200):
            sock.close()
            raise ProviderError(f"docker engine: {path}: HTTP {status}: {rest.decode(errors='replace')[:500]}")
        return sock, rest

    def _kill_exec(self, exec_id: str) -> None:
        """Kill a timed-out exec's process (the engine has no API for it)."""
        try:
            pid = self.api.exec_inspect(exec_id).get("Pid")
            if pid and self._local_engine():
                os.kill(int(pid), signal.SIGKILL)
        except Exception as e:  # best effort
            log.debug(f"could not kill exec {exec_id[:12]}: {e}")

    def engine_started(self) -> float | None:
        """When the local Docker engine's process started (epoch seconds), or None."""
        if not self._local_engine():
            return None
        try:
            pid = int(Path("/var/run/docker.pid").read_text().strip())
            return psutil.Process(pid).create_time()
        except (OSError, ValueError, psutil.Error):
            return None

    def _why_stopped(self, machine: Machine) -> str:
        """For an error on a machine: that it is not running, since when, and whether
        the Docker engine restarted after it started (which stops every machine)."""
        try:
            st = self.api.inspect_container(machine.name)["State"]
        except (derr.APIError, requests.exceptions.RequestException):
            return ""
        if st.get("Running"):
            return ""
        why = f" (machine {st.get('Status')}, exit code {st.get('ExitCode')}, finished {st.get('FinishedAt', '?')[:19]})"
        started, engine = _epoch(st.get("StartedAt")), self.engine_started()
        if started and engine and engine > started:
            why += (f"; the Docker engine restarted at {time.strftime('%H:%M:%S', time.localtime(engine))}, after "
                    f"the machine started: a restart stops every machine of every cluster")
        return why

    def _local_engine(self) -> bool:
        return self.api.base_url.startswith("http+docker://localhost")

    def _engine_major(self) -> int:
        if self._engine_version is None:
            self._engine_version = str(self.api.version().get("Version", "0"))
        try:
            return int(self._engine_version.split(".")[0])
        except ValueError:
            return 0

    # --------------------------------------------------------------- files
    def _on_tmpfs(self, machine: Machine, path: str) -> bool:
        """Whether path is on one of the container's tmpfs mounts while it
        runs: the engine's archive API only sees the container's filesystem
        and volumes, not tmpfs mounts (docker cp has the same limitation)."""
        try:
            info = self.api.inspect_container(machine.name)
        except derr.NotFound as e:
            raise ProviderError(f"{machine.name}: no such machine") from e
        if not info["State"].get("Running"):
            return False
        p = os.path.normpath(path)
        return any(p == t or p.startswith(t.rstrip("/") + "/") for t in (info["HostConfig"].get("Tmpfs") or {}))

    def copy_to(self, machine: Machine, dest: str, data: bytes, mode: int = 0o644) -> None:
        if not dest.startswith("/"):
            raise ValueError(f"copy_to: dest must be absolute, got {dest!r}")
        if isinstance(data, str):
            data = data.encode()
        if self._on_tmpfs(machine, dest):
            script = 'mkdir -p "$(dirname "$1")" && cat > "$1.kh-tmp" && chmod "$2" "$1.kh-tmp" && mv -f "$1.kh-tmp" "$1"'
            code, _, err = self._exec_bytes(machine, ["sh", "-c", script, "sh", dest, f"{mode:o}"], data, 300)
            if code != 0:
                raise ProviderError(f"{machine.name}: copy to {dest}: {_dec(err).strip()}")
            return
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            ti = tarfile.TarInfo(dest.lstrip("/"))
            ti.size, ti.mode, ti.mtime = len(data), mode, int(time.time())
            tf.addfile(ti, io.BytesIO(data))
        try:
            # missing parent directories are created by the engine
            ok = self.api.put_archive(machine.name, "/", buf.getvalue())
        except derr.APIError as e:
            raise ProviderError(f"{machine.name}: copy to {dest}: {e.explanation or e}") from e
        if not ok:
            raise ProviderError(f"{machine.name}: copy to {dest} failed")

    def copy_from(self, machine: Machine, src: str) -> bytes:
        """A file's content; for a directory, a tar archive of it."""
        if self._on_tmpfs(machine, src):
            code, out, err = self._exec_bytes(
                machine, ["sh", "-c", 'if [ -d "$1" ]; then tar -C "$1" -cf - .; else cat "$1"; fi', "sh", src],
                None, 300)
            if code != 0:
                raise ProviderError(f"{machine.name}: copy from {src}: {_dec(err).strip()}")
            return out
        try:
            stream, stat = self.api.get_archive(machine.name, src)
        except derr.NotFound as e:
            raise ProviderError(f"{machine.name}: {src}: no such file") from e
        except derr.APIError as e:
            raise ProviderError(f"{machine.name}: copy from {src}: {e.explanation or e}") from e
        raw = b"".join(stream)
        with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
            members = tf.getmembers()
            first = members[0] if members else None
            if first is not None and first.issym() and len(members) == 1:
                target = first.linkname if first.linkname.startswith("/") else \
                    os.path.normpath(os.path.join(os.path.dirname(src), first.linkname))
                return self.copy_from(machine, target)
            if first is not None and first.isfile() and len(members) == 1:
                f = tf.extractfile(first)
                return f.read() if f else b""
        return raw

    # ------------------------------------------------------------ lifecycle
    def logs(self, machine: Machine) -> str:
        try:
            return _dec(self.api.logs(machine.name, stdout=True, stderr=True))
        except derr.NotFound:
            return ""

    def health(self, machine: Machine) -> Health:
        try:
            info = self.api.inspect_container(machine.name)
        except derr.NotFound:
            return Health(False, False, "container does not exist")
        st = info["State"]
        if not st.get("Running"):
            return Health(False, False, f"container {st.get('Status')} (exit code {st.get('ExitCode')}) {st.get('Error') or ''}".strip())
        if st.get("Restarting"):
            return Health(False, False, "container restarting")
        labels = info["Config"].get("Labels") or {}
        if labels.get(L_ROLE) == "load-balancer":
            return Health(True, True, "haproxy running")
        try:
            r = self.exec(machine, ["systemctl", "is-system-running"], check=False, timeout=15)
        except ProviderError as e:
            return Health(True, False, f"systemctl: {e}")
        state = r.stdout.strip() or r.stderr.strip()
        return Health(True, state in ("running", "degraded"), f"systemd {state}")

    def wait_booted(self, machine: Machine, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        last = None
        while time.monotonic() < end:
            last = self.health(machine)
            if last.booted:
                if last.detail == "systemd degraded":
                    failed = self.exec(machine, ["systemctl", "--failed", "--no-legend", "--plain"], check=False)
                    log.warning(f"{machine.name}: systemd degraded: {failed.stdout.strip()}",
                                extra={"machine": machine.name})
                return
            if not last.running and "restarting" not in last.detail:
                raise ProviderError(f"{machine.name}: machine stopped while booting: {last.detail}\n"
                                    f"{self.logs(machine)[-3000:]}")
            time.sleep(0.25)
        raise ProviderError(f"{machine.name}: not booted after {timeout:.0f}s: {last.detail if last else ''}\n"
                            f"{self.logs(machine)[-3000:]}")

    def stop_machine(self, machine: Machine) -> None:
        try:
            self.api.stop(machine.name, timeout=int(self.options.get("stop_timeout", 30)))
        except derr.NotFound as e:
            raise ProviderError(f"{machine.name}: no such machine") from e
        # the engine answers once the container stopped, but its container list (what
        # list_machines reads) is updated a moment later, after the restart-policy check
        end = time.monotonic() + 10
        while time.monotonic() < end:
            listed = self.api.containers(all=True, filters={"name": f"^/{machine.name}$"})
            if not listed or listed[0].get("State") != "running":
                return
            time.sleep(0.1)
        raise ProviderError(f"{machine.name}: stopped, but still listed as running after 10s")

    def start_machine(self, machine: Machine) -> Machine:
        try:
            self.api.start(machine.name)
        except derr.NotFound as e:
            raise ProviderError(f"{machine.name}: no such machine") from e
        except derr.APIError as e:
            raise ProviderError(f"{machine.name}: start: {e.explanation or e}") from e
        m = self.get_machine(machine.name) or machine
        self.wait_booted(m, timeout=float(self.options.get("boot_timeout", 120)))
        return self.get_machine(machine.name) or m

    def host_endpoint(self, machine: Machine, port: int) -> tuple[str, int]:
        try:
            info = self.api.inspect_container(machine.name)
        except derr.NotFound as e:
            raise ProviderError(f"{machine.name}: no such machine") from e
        bindings = (info["NetworkSettings"].get("Ports") or {}).get(f"{port}/tcp") or \
            ((info["HostConfig"].get("PortBindings") or {}).get(f"{port}/tcp")) or []
        for b in bindings:
            if b.get("HostPort"):
                ip = b.get("HostIp") or "127.0.0.1"
                if ip in ("0.0.0.0", "::", ""):
                    ip = "127.0.0.1"
                return ip, int(b["HostPort"])
        return machine.ip, port

    # ------------------------------------------------------------- artifacts
    def collect_artifacts(self, machine: Machine, dest_dir: str) -> list[str]:
        """journal (all, kubelet, containerd), docker inspect, container log,
        failed units and /var/log/pods. Never raises."""
        try:
            return self._collect(machine, dest_dir)
        except Exception as e:  # runs on failure paths: report, never raise
            log.warning(f"collect_artifacts {machine.name}: {type(e).__name__}: {e}")
            return []

    def _collect(self, machine: Machine, dest_dir: str) -> list[str]:
        out = Path(dest_dir)
        written: list[str] = []
        try:
            self.api.inspect_container(machine.name)
        except Exception as e:  # gone (or no engine): nothing to collect
            log.warning(f"collect_artifacts {machine.name}: {e}")
            return written
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            log.warning(f"collect_artifacts {machine.name}: {e}")
            return written

        def save(name: str, fn) -> None:
            try:
                data = fn()
                if data is None:
                    return
                p = out / name
                p.write_bytes(data if isinstance(data, bytes) else str(data).encode())
                written.append(str(p))
            except Exception as e:
                log.debug(f"collect_artifacts {machine.name} {name}: {e}")
                with contextlib.suppress(Exception):
                    (out / f"{name}.error").write_text(f"{type(e).__name__}: {e}\n")

        def run(*cmd: str) -> str | None:
            r = self.exec(machine, list(cmd), check=False, timeout=120)
            return r.stdout + (f"\n--- stderr (exit {r.exit_code}) ---\n{r.stderr}" if r.stderr.strip() else "")

        save("inspect.json", lambda: json.dumps(self.api.inspect_container(machine.name), indent=2))
        save("container.log", lambda: self.logs(machine))
        running = False
        with contextlib.suppress(Exception):
            running = bool(self.api.inspect_container(machine.name)["State"].get("Running"))
        role = machine.role or (self.get_machine(machine.name) or machine).role
        if running and role == "load-balancer":
            save("haproxy.cfg", lambda: self.copy_from(machine, HAPROXY_CFG))
        elif running:
            save("journal.log", lambda: run("journalctl", "--no-pager", "-o", "short-precise"))
            save("kubelet.log", lambda: run("journalctl", "--no-pager", "-o", "short-precise", "-u", "kubelet"))
            save("containerd.log", lambda: run("journalctl", "--no-pager", "-o", "short-precise", "-u", "containerd"))
            save("systemd-units.txt", lambda: run("systemctl", "list-units", "--all", "--no-pager"))
            save("failed-units.txt", lambda: run("systemctl", "--failed", "--no-pager"))
        try:
            stream, _ = self.api.get_archive(machine.name, "/var/log/pods")
            raw = b"".join(stream)
            written += _safe_extract(raw, out)
        except derr.NotFound:
            pass
        except Exception as e:
            log.debug(f"collect_artifacts {machine.name} pods: {e}")
        return written

    # --------------------------------------------------------------- cleanup
    @engine_guarded
    def list_owned(self, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        filters = {"label": [L_CLUSTER] + [f"{k}={v}" for k, v in selector.items()]}
        objs: list[dict[str, Any]] = []
        for c in self.api.containers(all=True, filters=filters):
            objs.append({"kind": "machine", "name": c["Names"][0].lstrip("/"), "id": c["Id"],
                         "labels": c.get("Labels") or {}, "state": c.get("State")})
        for v in self.api.volumes(filters=filters).get("Volumes") or []:
            objs.append({"kind": "volume", "name": v["Name"], "id": v["Name"], "labels": v.get("Labels") or {}})
        for n in self.api.networks(filters=filters):
            objs.append({"kind": "network", "name": n["Name"], "id": n["Id"], "labels": n.get("Labels") or {}})
        return objs

    @engine_guarded
    def delete_owned(self, selector: Mapping[str, str]) -> list[str]:
        deleted: list[str] = []
        objs = self.list_owned(selector)
        errors: list[str] = []
        for o in (o for o in objs if o["kind"] == "machine"):
            try:
                deleted += self._remove_container(o["id"], o["name"])
            except ProviderError as e:
                errors.append(str(e))
        for v in self.api.volumes(filters={"label": [L_CLUSTER] + [f"{k}={v}" for k, v in selector.items()]}).get("Volumes") or []:
            try:
                if self._remove_volume(v["Name"]):
                    deleted.append(f"volume/{v['Name']}")
            except ProviderError as e:
                errors.append(str(e))
        for o in (o for o in objs if o["kind"] == "network"):
            try:
                info = self.api.inspect_network(o["id"])
                for cid in (info.get("Containers") or {}):
                    with contextlib.suppress(derr.APIError):
                        self.api.disconnect_container_from_network(cid, o["id"], force=True)
                self.api.remove_network(o["id"])
                deleted.append(f"network/{o['name']}")
            except derr.NotFound:
                pass
            except derr.APIError as e:
                errors.append(f"removing network {o['name']}: {e}")
        if deleted:
            log.info(f"deleted {len(deleted)} objects matching {dict(selector)}", extra={"phase": "cleanup"})
        if errors:
            raise ProviderError("cleanup incomplete: " + "; ".join(errors))
        return deleted

    # --------------------------------------------------------- load balancer
    def ensure_load_balancer(self, cluster: str, namespace: str, owner: Owner,
                             backends: Sequence[tuple[str, str]], port: int = API_PORT) -> Machine:
        name = lb_name(cluster)
        cfg = haproxy_config(backends, port)
        net = self._ensure_network(cluster, namespace, owner)
        info = None
        with contextlib.suppress(derr.NotFound):
            info = self.api.inspect_container(name)
        if info is not None:
            labels = info["Config"].get("Labels") or {}
            if labels.get(L_CLUSTER) != cluster or labels.get(L_NAMESPACE) != namespace:
                raise ProviderError(f"container {name} exists but belongs to "
                                    f"{labels.get(L_NAMESPACE)}/{labels.get(L_CLUSTER)}, not {namespace}/{cluster}")
            m = self._to_machine(info)
            current = b""
            with contextlib.suppress(ProviderError):
                current = self.copy_from(m, HAPROXY_CFG)
            running = bool(info["State"].get("Running"))
            if current.decode(errors="replace") != cfg:
                self._write_lb_config(m, cfg, validate=running)
                if running:
                    self.api.kill(name, signal="SIGUSR2")  # haproxy master: reload, keep connections
                    log.info(f"load balancer {name} reconfigured: {[b[0] for b in backends]}",
                             extra={"cluster": cluster, "phase": "load-balancer"})
            if not running:
                self.api.start(name)
            self._wait_lb(name, port)
            return self.get_machine(name) or m
        labels = {**owner_labels(cluster, namespace, owner), L_ROLE: "load-balancer", L_DEPLOYMENT: name}
        image = self.options.get("lb_image")
        if not image:
            from providers.docker.nodeimage.base import build_base_image
            image = build_base_image()
        container = dict(hostname=name, labels=labels, entrypoint=HAPROXY_CMD[:1], command=HAPROXY_CMD[1:],
                         stop_signal="SIGTERM")
        # no /var volume for the load balancer: a tmpfs covers the image's VOLUME
        host = dict(init=False, restart_policy={"Name": "on-failure", "MaximumRetryCount": 1},
                    tmpfs={"/var": "rw", "/tmp": "rw", "/run": "rw"})

        def put_config(cid: str) -> None:  # created, not started: put the config in
            self.copy_to(Machine(name=cid, cluster=cluster, namespace=namespace, role="load-balancer",
                                 deployment=name, provider_id="", state="created"), HAPROXY_CFG, cfg.encode())

        try:
            self._create_and_start(name, image, net["Id"], [(f"{port}/tcp", "127.0.0.1", 0)], container, host,
                                   before_start=put_config)
        except ProviderError as e:
            if "already exists" in str(e):  # another process created it: reconcile that one
                return self.ensure_load_balancer(cluster, namespace, owner, backends, port)
            raise
        m = self.get_machine(name)
        self._wait_lb(name, port)
        log.info(f"load balancer {name} started: {[b[0] for b in backends]}",
                 extra={"cluster": cluster, "phase": "load-balancer"})
        return self.get_machine(name) or m

    def _write_lb_config(self, m: Machine, cfg: str, validate: bool = True) -> None:
        if validate:
            self.copy_to(m, HAPROXY_CFG + ".new", cfg.encode())
            r = self.exec(m, ["haproxy", "-c", "-q", "-f", HAPROXY_CFG + ".new"], check=False, timeout=30)
            if not r.ok:
                raise ProviderError(f"{m.name}: invalid haproxy config: {r.stderr or r.stdout}\n{cfg}")
            self.exec(m, ["mv", HAPROXY_CFG + ".new", HAPROXY_CFG], timeout=30)
        else:
            self.copy_to(m, HAPROXY_CFG, cfg.encode())

    def _wait_lb(self, name: str, port: int, timeout: float = 30) -> None:
        """Until haproxy runs and accepts connections on its port (checked
        inside the container: docker-proxy accepts on the host side even
        when nothing listens behind it)."""
        end = time.monotonic() + timeout
        detail = ""
        while time.monotonic() < end:
            info = self.api.inspect_container(name)
            st = info["State"]
            if not st.get("Running") and not st.get("Restarting") and st.get("Status") != "created":
                raise ProviderError(f"load balancer {name} exited ({st.get('ExitCode')}): "
                                    f"{_dec(self.api.logs(name))[-2000:]}")
            if st.get("Running"):
                m = self._to_machine(info)
                try:
                    r = self.exec(m, ["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"], check=False, timeout=10)
                    if r.ok:
                        return
                    detail = r.stderr.strip()
                except ProviderError as e:
                    detail = str(e)
            time.sleep(0.2)
        raise ProviderError(f"load balancer {name} not accepting connections after {timeout:.0f}s: {detail}\n"
                            f"{_dec(self.api.logs(name))[-2000:]}")

    # ----------------------------------------------------------------- images
    def node_image(self, version: str | None, **kw: Any) -> str:
        """The image machines boot from. ``image`` (provider option) wins;
        without a Kubernetes version (machines only, no bootstrap) this is
        the base image. Kubernetes node images are built by the node image
        builder on top of :func:`providers.docker.nodeimage.build_base_image`."""
        if kw.get("image"):
            return str(kw["image"])
        if version is None:
            from providers.docker.nodeimage.base import build_base_image
            return build_base_image()
        raise NotImplementedError(
            f"docker provider: no node image for Kubernetes {version}: set spec.provider.options.image "
            f"to a node image, or use the node image builder (built on top of the "
            f"kube-harness/base image from providers.docker.nodeimage.build_base_image)")


def haproxy_config(backends: Sequence[tuple[str, str]], port: int = API_PORT) -> str:
    """TCP load balancing of ``:port`` over the backends' ``:port``."""
    lines = [
        "# generated by kube-harness (docker provider)",
        "global",
        "  log stdout format raw local0 info",
        "  maxconn 4000",  # fits the default fd limit of a container
        "defaults",
        "  mode tcp",
        "  log global",
        "  option dontlognull",
        "  timeout connect 5s",
        # long-lived watches through the API load balancer
        "  timeout client 1h",
        "  timeout server 1h",
        "  timeout tunnel 1h",
        "frontend control-plane",
        f"  bind *:{port}",
        "  default_backend kube-apiservers",
        "backend kube-apiservers",
        "  balance roundrobin",
        "  option tcp-check",
        "  default-server inter 2s fall 2 rise 1 init-addr last,libc,none",
    ]
    for name, addr in backends:
        lines.append(f"  server {name} {addr}:{port} check")
    return "\n".join(lines) + "\n"


def _epoch(docker_time: str | None) -> float | None:
    """Docker's RFC 3339 time (nanoseconds, Z) as epoch seconds."""
    if not docker_time or docker_time.startswith("0001-"):
        return None
    from datetime import datetime
    try:
        return datetime.fromisoformat(docker_time[:26].rstrip("Z").split(".")[0] + "+00:00").timestamp()
    except ValueError:
        return None


def _dec(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b if isinstance(b, str) else b.decode("utf-8", errors="replace")


def _shutdown_write(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)


def _safe_extract(raw: bytes, dest: Path) -> list[str]:
    """Extract a tar (from get_archive) below dest, refusing escapes and links."""
    written = []
    root = dest.resolve()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        for ti in tf.getmembers():
            target = (root / ti.name).resolve()
            if root not in target.parents and target != root:
                continue
            if ti.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif ti.isfile():
                target.parent.mkdir(parents=True, exist_ok=True)
                f = tf.extractfile(ti)
                if f is not None:
                    target.write_bytes(f.read())
                    written.append(str(target))
    return written

