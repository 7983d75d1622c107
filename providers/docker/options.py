"""Validation of the Docker provider's options (``spec.provider.options``),
so that a typo fails when the spec is loaded, naming the option, instead of
half way through creating machines."""
from __future__ import annotations

import difflib
import ipaddress
import os
import re
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
