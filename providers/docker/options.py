"""The Docker provider's options (``spec.provider.options``): their validation, so
that a typo fails when the spec is loaded, naming the option, instead of half way
through creating machines, and :func:`resolve`, the typed options of one role.

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

They also arrive as ``MachineSpec.options`` (merged over the provider's) and as
keywords of ``node_image``. An unknown key or a bad value fails naming
``spec.provider.options.<key>``.
"""
from __future__ import annotations

import difflib
import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from providers.base import OptionError

ROLES = ("control-plane", "worker")
PROPAGATION = ("private", "rslave", "rshared", "None", "HostToContainer", "Bidirectional")
PROTOCOLS = ("tcp", "udp", "sctp")
MEMORY_RE = re.compile(r"^\d+(\.\d+)?[bkmgBKMG]?$")


def _num(lo: float, hi: float | None = None, integer: bool = False) -> Callable[[Any], str | None]:
    what = ("an integer" if integer else "a number") + (f" from {lo} to {hi}" if hi is not None else f" >= {lo}")

    def check(v: Any) -> str | None:
        ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok_type or v < lo or (hi is not None and v > hi):
            return what
        return None
    return check


def _one_of(*allowed: Any) -> Callable[[Any], str | None]:
    return lambda v: None if v in allowed else f"one of {list(allowed)}"


def _str(v: Any) -> str | None:
    return None if isinstance(v, str) and v else "a non-empty string"


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def _subnet(v: Any) -> str | None:
    try:
        ipaddress.ip_network(str(v), strict=True)
        return None
    except ValueError:
        return "a network in CIDR form, e.g. 172.30.0.0/16"


def _ipv6_subnet(v: Any) -> str | None:
    try:
        net = ipaddress.ip_network(str(v), strict=True)
    except ValueError:
        net = None
    return None if net is not None and net.version == 6 and net.prefixlen <= 112 else \
        "an IPv6 network in CIDR form, /112 or larger, e.g. fd00:172:18::/64"


NETWORK_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")


def _networks(v: Any) -> str | None:
    ok = isinstance(v, list) and all(isinstance(n, str) and NETWORK_RE.match(n) for n in v) and len(set(v)) == len(v)
    return None if ok else 'a list of distinct Docker network names, e.g. ["kind"]'


def _memory(v: Any) -> str | None:
    ok = (isinstance(v, int) and not isinstance(v, bool) and v > 0) or (isinstance(v, str) and MEMORY_RE.match(v))
    return None if ok else 'bytes, or docker syntax like "2g", "512m"'


def _env(v: Any) -> str | None:
    if isinstance(v, dict) and all(isinstance(k, str) and k for k in v):
        return None
    return "a mapping of variable names to values"


SCALARS: dict[str, Callable[[Any], str | None]] = {
    "image": _str, "lb_image": _str,
    "cgroupns": _one_of("private", "host"),
    "privileged": _one_of("auto", True, False),
    "boot_timeout": _num(1), "stop_timeout": _num(0, integer=True), "wait": _bool,
    "subnet": _subnet, "ipv6_subnet": _ipv6_subnet, "mtu": _num(576, 9216, integer=True),
    "memory": _memory, "cpus": _num(0.01), "env": _env, "networks": _networks,
}
MOUNT_KEYS = ["host_path", "hostPath", "container_path", "containerPath", "readonly", "readOnly", "propagation"]
PORT_KEYS = ["container_port", "containerPort", "host_port", "hostPort", "listen_address", "listenAddress", "protocol"]
KNOWN = sorted([*SCALARS, "extra_mounts", "extra_ports", "roles"])


def _one_of_keys(key: Any, known: list[str], what: str) -> str:
    """``what`` (naming the allowed keys) and a "did you mean" for a misspelt ``key``."""
    close = difflib.get_close_matches(str(key), known, n=1)
    return what + (f" (did you mean {close[0]!r}?)" if close else "")


def validate(options: Mapping[str, Any], prefix: str = "", nested: bool = False) -> None:
    """Raise OptionError for the first bad option (``prefix`` is its path)."""
    for key, value in options.items():
        path = f"{prefix}{key}"
        if key in SCALARS:
            bad = SCALARS[key](value)
            if bad:
                raise OptionError(path, value, bad)
        elif key == "extra_mounts":
            _mounts(value, path)
        elif key == "extra_ports":
            _ports(value, path)
        elif key == "roles" and not nested:
            if not isinstance(value, dict):
                raise OptionError(path, value, f"a mapping with keys from {list(ROLES)}")
            for role, sub in value.items():
                if role not in ROLES:
                    raise OptionError(f"{path}.{role}", sub, _one_of_keys(
                        role, list(ROLES), f"options for one of the roles {list(ROLES)}"))
                if not isinstance(sub, dict):
                    raise OptionError(f"{path}.{role}", sub, "a mapping of options")
                validate(sub, f"{path}.{role}.", nested=True)
        else:
            allowed = [k for k in KNOWN if not (nested and k == "roles")]
            raise OptionError(path, value,
                              _one_of_keys(key, allowed, f"one of the docker provider's options {allowed}"))


def _mounts(value: Any, path: str) -> None:
    if not isinstance(value, list):
        raise OptionError(path, value, "a list of mounts")
    for i, m in enumerate(value):
        p = f"{path}[{i}]"
        if not isinstance(m, dict):
            raise OptionError(p, m, "a mapping with host_path and container_path")
        _known_keys(m, p, MOUNT_KEYS, "host_path, container_path, readonly, propagation")
        host = m.get("host_path", m.get("hostPath"))
        cont = m.get("container_path", m.get("containerPath"))
        if not isinstance(host, str) or not os.path.exists(host):
            raise OptionError(f"{p}.host_path", host, "an existing path on the Docker host")
        if not isinstance(cont, str) or not cont.startswith("/"):
            raise OptionError(f"{p}.container_path", cont, "an absolute path in the node")
        prop = m.get("propagation")
        if prop is not None and prop not in PROPAGATION:
            raise OptionError(f"{p}.propagation", prop, f"one of {list(PROPAGATION)}")


def _ports(value: Any, path: str) -> None:
    if not isinstance(value, list):
        raise OptionError(path, value, "a list of ports")
    port = _num(1, 65535, integer=True)
    for i, pm in enumerate(value):
        p = f"{path}[{i}]"
        if not isinstance(pm, dict):
            raise OptionError(p, pm, "a mapping with container_port")
        _known_keys(pm, p, PORT_KEYS, "container_port, host_port, listen_address, protocol")
        cp = pm.get("container_port", pm.get("containerPort"))
        if port(cp):
            raise OptionError(f"{p}.container_port", cp, port(cp))
        hp = pm.get("host_port", pm.get("hostPort", 0))
        if hp != 0 and port(hp):
            raise OptionError(f"{p}.host_port", hp, "0 (a free port) or an integer from 1 to 65535")
        proto = str(pm.get("protocol", "tcp")).lower()
        if proto not in PROTOCOLS:
            raise OptionError(f"{p}.protocol", pm.get("protocol"), f"one of {list(PROTOCOLS)}")
        addr = pm.get("listen_address", pm.get("listenAddress", "127.0.0.1"))
        try:
            ipaddress.ip_address(str(addr))
        except ValueError:
            raise OptionError(f"{p}.listen_address", addr, "an IP address of the host") from None


def _known_keys(m: Mapping[str, Any], path: str, known: list[str], what: str) -> None:
    for k in m:
        if k not in known:
            raise OptionError(f"{path}.{k}", m[k], _one_of_keys(k, known, what))


# --- typed options, resolved per role

@dataclass(frozen=True)
class Mount:
    """A host path in the node (``extra_mounts``); host_path is absolute."""
    host_path: str
    container_path: str
    readonly: bool = False
    propagation: str | None = None


@dataclass(frozen=True)
class Port:
    """A node port published on the host (``extra_ports``); host_port 0 picks a free one."""
    container_port: int
    protocol: str = "tcp"
    listen_address: str = "127.0.0.1"
    host_port: int = 0


@dataclass(frozen=True)
class DockerOptions:
    """The options of one role's machines (or the provider's own, without a role)."""
    image: str | None = None
    lb_image: str | None = None
    cgroupns: str = "private"
    privileged: bool | str = "auto"  # True, False or "auto"
    boot_timeout: float = 120
    stop_timeout: int = 30
    wait: bool = True
    subnet: str | None = None
    ipv6_subnet: str | None = None
    mtu: int = 1500
    memory: int | str | None = None
    cpus: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    networks: tuple[str, ...] = ()
    extra_mounts: tuple[Mount, ...] = ()
    extra_ports: tuple[Port, ...] = ()


def resolve(options: Mapping[str, Any] | None, role: str | None = None) -> DockerOptions:
    """The typed options: ``roles[role]`` merged over the top-level ones, defaults filled in."""
    opts = dict(options or {})
    if role:
        opts.update((opts.get("roles") or {}).get(role) or {})
    privileged = opts.get("privileged", "auto")
    return DockerOptions(
        image=opts.get("image") or None, lb_image=opts.get("lb_image") or None,
        cgroupns=opts.get("cgroupns", "private"),
        privileged=True if privileged is True or privileged == "true" else "auto" if privileged == "auto" else False,
        boot_timeout=float(opts.get("boot_timeout", 120)), stop_timeout=int(opts.get("stop_timeout", 30)),
        wait=bool(opts.get("wait", True)), subnet=opts.get("subnet") or None,
        ipv6_subnet=opts.get("ipv6_subnet") or None, mtu=int(opts.get("mtu", 1500)),
        memory=opts.get("memory") or None, cpus=float(opts["cpus"]) if opts.get("cpus") else None,
        env={str(k): str(v) for k, v in (opts.get("env") or {}).items()},
        networks=tuple(opts.get("networks") or ()),
        extra_mounts=tuple(_mount(m) for m in opts.get("extra_mounts") or ()),
        extra_ports=tuple(_port(p) for p in opts.get("extra_ports") or ()))


def _mount(m: Mapping[str, Any]) -> Mount:
    return Mount(host_path=os.path.abspath(m.get("host_path") or m.get("hostPath")),
                 container_path=m.get("container_path") or m.get("containerPath"),
                 readonly=bool(m.get("readonly") or m.get("readOnly")), propagation=m.get("propagation"))


def _port(p: Mapping[str, Any]) -> Port:
    return Port(container_port=int(p.get("container_port") or p.get("containerPort")),
                protocol=p.get("protocol", "tcp").lower(),
                listen_address=p.get("listen_address") or p.get("listenAddress") or "127.0.0.1",
                host_port=int(p.get("host_port") or p.get("hostPort") or 0))
