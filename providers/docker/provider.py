"""Docker machine provider: machines are privileged systemd containers on a
per-cluster bridge network, as kind and Cluster API's CAPD run them. The class
composes the parts below; its options are documented in :mod:`.options`.

Objects and names
-----------------
* network ``kh-<namespace>-<cluster>`` (:mod:`.network`), labelled with ``owner_labels``;
* machine = container named ``spec.name`` (hostname too), labelled with
  ``spec.all_labels()``, with a named volume ``<name>-var`` on ``/var``
  carrying the same labels (the image's ``/var`` is copied into it on first
  use; containerd's overlayfs snapshotter cannot run on the container's own
  overlay root); its create arguments: :mod:`.machine_config`;
* load balancer = container ``<cluster>-lb`` (role ``load-balancer``)
  running haproxy from the base image (:mod:`.loadbalancer`).

Everything is found again by labels (:mod:`.cleanup`): no state file, safe across processes.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Mapping, Sequence

from providers.base import (L_CLUSTER, L_NAMESPACE, L_ROLE, ExecResult, Health, Machine, MachineProvider,
                            MachineSpec, Owner, ProviderError)

from . import host, images
from .artifacts import collect_artifacts
from .cleanup import Cleanup
from .containers import Containers
from .engine import Engine
from .loadbalancer import LoadBalancers
from .machine_config import API_PORT, NODE_ROLES, machine_config, volume_name
from .network import Networks
from .options import resolve, validate

log = logging.getLogger("harness.provider.docker")


class DockerProvider(MachineProvider):
    name = "docker"

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        validate(options)

    def __init__(self, options: Mapping[str, Any] | None = None):
        super().__init__(options)
        self.own_options = resolve(self.options)  # the provider's, of no role
        self.engine = Engine()
        self.networks = Networks(self.engine, self.own_options.mtu, self.own_options.subnet,
                                 self.own_options.ipv6_subnet)
        self.containers = Containers(self.engine)
        self.cleanup = Cleanup(self.engine)
        self.load_balancers = LoadBalancers(self.engine, self.networks, self.containers,
                                            image=lambda: self.own_options.lb_image or images.base_image())

    @property
    def client(self):
        return self.engine.client

    def close(self) -> None:
        self.engine.close()

    # ------------------------------------------------------------ provisioning
    def ensure_infrastructure(self, cluster: str, namespace: str, owner: Owner,
                              ip_families: Sequence[int] = (4,)) -> None:
        net = self.networks.ensure(cluster, namespace, owner, ipv6=6 in ip_families)
        if 6 in ip_families and not net.get("EnableIPv6"):
            raise ProviderError(f"network {net['Name']} exists without IPv6, which the cluster's IP family needs; "
                                f"delete the cluster first (`kube-harness down {cluster} -n {namespace}`)")

    def delete_infrastructure(self, cluster: str, namespace: str) -> None:
        for c in self.containers.find({L_CLUSTER: cluster, L_NAMESPACE: namespace, L_ROLE: "load-balancer"}):
            self.cleanup.remove_container(c["Id"], c["Names"][0].lstrip("/"))
        self.networks.delete(cluster, namespace)

    def create_machine(self, spec: MachineSpec) -> Machine:
        if spec.role not in NODE_ROLES:
            raise ProviderError(f"{spec.name}: role {spec.role!r} is not a node role; "
                                "use ensure_load_balancer for load balancers")
        opts = resolve({**self.options, **dict(spec.options or {})}, spec.role)
        net = self.networks.ensure(spec.cluster, spec.namespace, spec.owner)
        config = machine_config(spec, opts, host.host_facts(self.engine), ipv6=bool(net.get("EnableIPv6")))
        volume = self.containers.fresh_volume(config.volume, config.labels)
        try:
            extra = [self.networks.ensure_shared(n) for n in config.networks]
            self.containers.create_and_start(spec.name, config.image, net["Id"], config.ports, config.container,
                                             config.host, config.raw_host,
                                             before_start=lambda cid: self.networks.connect(cid, spec.name, extra))
        except BaseException:
            with contextlib.suppress(Exception):
                if self.get_machine(spec.name) is None:  # nothing uses it: do not leave it behind
                    self.cleanup.remove_volume(volume)
            raise
        m = self.get_machine(spec.name)
        if m is None:
            raise ProviderError(f"{spec.name}: container vanished after start")
        log.info(f"machine {spec.name} started ({spec.role}, {m.ip})",
                 extra={"cluster": spec.cluster, "machine": spec.name, "phase": "machine-start"})
        if opts.wait:
            self.wait_booted(m, timeout=opts.boot_timeout)
            m = self.get_machine(spec.name) or m
        return m

    def delete_machine(self, machine: Machine) -> None:
        self.cleanup.remove_container(machine.name, machine.name)
        self.cleanup.remove_volume(volume_name(machine.name))
        log.info(f"deleted machine {machine.name}", extra={"machine": machine.name, "phase": "machine-delete"})

    def wait_booted(self, machine: Machine, timeout: float = 120) -> None:
        self.containers.wait_booted(machine, timeout)

    # ---------------------------------------------------------------- machines
    def list_machines(self, cluster: str | None = None, namespace: str | None = None,
                      selector: Mapping[str, str] | None = None) -> list[Machine]:
        return self.containers.list_machines(cluster, namespace, selector)

    def get_machine(self, name: str) -> Machine | None:
        return self.containers.get_machine(name)

    def health(self, machine: Machine) -> Health:
        return self.containers.health(machine)

    def stop_machine(self, machine: Machine) -> None:
        self.containers.stop(machine, timeout=self.own_options.stop_timeout)

    def start_machine(self, machine: Machine) -> Machine:
        return self.containers.start(machine, boot_timeout=self.own_options.boot_timeout)

    def host_endpoint(self, machine: Machine, port: int) -> tuple[str, int]:
        return self.containers.host_endpoint(machine, port)

    # -------------------------------------------------------------------- exec
    def exec(self, machine: Machine, cmd: Sequence[str], *, input: bytes | None = None,
             check: bool = True, timeout: float | None = None, env: Mapping[str, str] | None = None) -> ExecResult:
        return self.engine.exec(machine, cmd, input=input, check=check, timeout=timeout, env=env)

    def copy_to(self, machine: Machine, dest: str, data: bytes, mode: int = 0o644) -> None:
        self.engine.copy_to(machine, dest, data, mode)

    def copy_from(self, machine: Machine, src: str) -> bytes:
        return self.engine.copy_from(machine, src)

    def logs(self, machine: Machine) -> str:
        return self.engine.logs(machine)

    def collect_artifacts(self, machine: Machine, dest_dir: str) -> list[str]:
        return collect_artifacts(self.engine, self.containers, machine, dest_dir)

    # ---------------------------------------------- load balancer, cleanup, images
    def ensure_load_balancer(self, cluster: str, namespace: str, owner: Owner,
                             backends: Sequence[tuple[str, str]], port: int = API_PORT) -> Machine:
        return self.load_balancers.ensure(cluster, namespace, owner, backends, port)

    def list_owned(self, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        return self.cleanup.list_owned(selector)

    def delete_owned(self, selector: Mapping[str, str]) -> list[str]:
        return self.cleanup.delete_owned(selector)

    def node_image(self, version: str | None, **options: Any) -> str:
        """The ``image`` option (it must exist locally), the base image without a
        Kubernetes version, else the version's node image (:mod:`.images`)."""
        return images.node_image(version, options.get("image"))

    def node_image_problem(self, image: str) -> str | None:
        return images.node_image_problem(image)

    def check_host_limits(self, cluster: str) -> None:
        host.check_host_limits(cluster)
