"""Docker networks: each cluster's own bridge network ``kh-<namespace>-<cluster>``
(embedded DNS: machines resolve each other by name), labelled with ``owner_labels``,
and shared networks machines of any cluster join (option ``networks``)."""
from __future__ import annotations

import contextlib
import hashlib
import logging
from typing import Iterator

import docker
from docker import errors as derr

from providers.base import Owner, ProviderError, owner_labels

from .engine import Engine

log = logging.getLogger("harness.provider.docker")


def network_name(cluster: str, namespace: str) -> str:
    return f"kh-{namespace}-{cluster}"


def ula_subnet(network: str) -> str:
    """A unique local IPv6 /64 for a network, derived from its name."""
    h = hashlib.sha256(network.encode()).hexdigest()
    return f"fd{h[:2]}:{h[2:6]}:{h[6:10]}:{h[10:14]}::/64"


@contextlib.contextmanager
def host_lock(what: str) -> Iterator[None]:
    """A lock shared by every process on this host (the build cache's lock directory)."""
    from filelock import FileLock
    from providers.docker.nodeimage.base import cache_dir
    d = cache_dir() / "locks"
    d.mkdir(parents=True, exist_ok=True)
    with FileLock(str(d / f"{what}.lock"), timeout=120):
        yield


class Networks:
    def __init__(self, engine: Engine, mtu: int = 1500, subnet: str | None = None, ipv6_subnet: str | None = None):
        self.engine, self.mtu, self.subnet, self.ipv6_subnet = engine, mtu, subnet, ipv6_subnet

    def _named(self, name: str) -> list[dict]:
        """Networks with exactly this name, oldest first (Docker allows duplicates)."""
        nets = [n for n in self.engine.api.networks(names=[name]) if n.get("Name") == name]
        return sorted(nets, key=lambda n: (n.get("Created", ""), n["Id"]))

    def _bridge_options(self) -> dict[str, str]:
        return {"com.docker.network.bridge.enable_ip_masquerade": "true",
                "com.docker.network.driver.mtu": str(self.mtu)}

    def ensure(self, cluster: str, namespace: str, owner: Owner, ipv6: bool = False) -> dict:
        """The cluster's network, made if missing (once, also when processes race);
        ``ipv6``: with an IPv6 subnet beside the IPv4 one."""
        api, name = self.engine.api, network_name(cluster, namespace)
        nets = self._named(name)
        if nets:
            return nets[0]
        with host_lock(f"network-{name}"):
            nets = self._named(name)
            if nets:
                return nets[0]
            pools = [docker.types.IPAMPool(subnet=self.subnet)] if self.subnet else []
            if ipv6:
                pools.append(docker.types.IPAMPool(subnet=self.ipv6_subnet or ula_subnet(name)))
            ipam = docker.types.IPAMConfig(pool_configs=pools) if pools else None
            try:
                api.create_network(name, driver="bridge", labels=owner_labels(cluster, namespace, owner),
                                   options=self._bridge_options(), ipam=ipam, check_duplicate=True,
                                   enable_ipv6=ipv6)
                log.info(f"created network {name}", extra={"cluster": cluster, "phase": "infrastructure"})
            except derr.APIError as e:
                if e.status_code != 409 and "already exists" not in str(e):
                    raise ProviderError(f"creating network {name}: {e}") from e
        # another host/process may still have raced us past the lock: keep the
        # oldest network of that name, remove the others while still empty
        nets = self._named(name)
        for extra in nets[1:]:
            with contextlib.suppress(derr.APIError):
                if not api.inspect_network(extra["Id"]).get("Containers"):
                    api.remove_network(extra["Id"])
        if not nets:
            raise ProviderError(f"network {name} vanished right after creation")
        return nets[0]

    def ensure_shared(self, name: str) -> str:
        """A network machines of any cluster may join (option ``networks``, e.g. CAPD's
        "kind"): made if missing, owned by no cluster, so never deleted with one."""
        with host_lock(f"network-{name}"):
            found = [n for n in self.engine.api.networks(names=[name]) if n["Name"] == name]
            if found:
                return found[0]["Id"]
            log.info(f"created shared network {name}", extra={"phase": "infrastructure"})
            return self.engine.api.create_network(name, driver="bridge", options=self._bridge_options())["Id"]

    def connect(self, container: str, alias: str, networks: list[str]) -> None:
        for n in networks:
            self.engine.api.connect_container_to_network(container, n, aliases=[alias])

    def delete(self, cluster: str, namespace: str) -> None:
        """Remove the cluster's network; it must have no containers left."""
        api, name = self.engine.api, network_name(cluster, namespace)
        for net in self._named(name):
            try:
                api.remove_network(net["Id"])
            except derr.NotFound:
                pass
            except derr.APIError as e:
                attached = [c.get("Name") for c in (api.inspect_network(net["Id"]).get("Containers") or {}).values()]
                raise ProviderError(f"network {name} still has containers {attached}; delete the machines first") from e
