"""The cluster handle tests receive, and its Cluster API shaped objects.

A ``Cluster`` is named and namespaced; its machines belong to
MachineDeployments (the control plane is one, with role control-plane).
Machines are found through the provider's labels, so any process (an xdist
worker, the CLI, a later run with --reuse-cluster) can rebuild the handle.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from providers.base import ExecResult, Machine, MachineProvider, Owner

from .schema import MAX_MACHINES
from .spec import ClusterSpec, SpecError


@dataclass
class MachineDeployment:
    """Desired state of a group of identical machines."""
    name: str
    cluster: str
    namespace: str
    role: str
    replicas: int
    version: str
    labels: dict[str, str] = field(default_factory=dict)


def write_private(path: Path, text: str) -> None:
    """Write ``path`` atomically, readable by its owner only (0600; its directory 0700):
    kubeconfigs, bootstrap state with tokens and keys."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class Cluster:
    """A provisioned cluster: its spec, machines, exec and (once bootstrapped)
    kubeconfig and Kubernetes API clients. Its state (spec version, replica
    counts, kubeconfig, bootstrapped) changes through its methods only."""

    def __init__(self, spec: ClusterSpec, provider: MachineProvider, owner: Owner,
                 state_dir: Path | None = None):
        self.spec = spec
        self.provider = provider
        self.owner = owner
        self.name, self.namespace = spec.name, spec.namespace
        self.state_dir = state_dir or self.state_dir_of(self.name, self.namespace)
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.deployments = {d.name: MachineDeployment(d.name, self.name, self.namespace, d.role, d.replicas,
                                                      spec.version, dict(d.labels)) for d in spec.deployments}
        self.bootstrapped = False
        self.timings: dict[str, float] = {}
        self._client = None

    @staticmethod
    def state_dir_of(name: str, namespace: str) -> Path:
        """Where a cluster's kubeconfig and state live on this host."""
        return Path(tempfile.gettempdir()) / "kube-harness" / f"{namespace}-{name}"

    @classmethod
    def forget(cls, name: str, namespace: str) -> None:
        """Remove what this host kept of a deleted cluster (kubeconfig, state)."""
        shutil.rmtree(cls.state_dir_of(name, namespace), ignore_errors=True)

    def check_replicas(self, deployment: str, replicas: object) -> None:
        """A replica count for ``deployment`` (scale): an int within the spec's
        limits, else SpecError (a ValueError) naming it, the value and what is allowed."""
        md = self.deployments[deployment]
        cp = md.role == "control-plane"
        low = 1 if cp else 0
        high = MAX_MACHINES - sum(d.replicas for d in self.deployments.values() if d is not md)
        if type(replicas) is not int or not low <= replicas <= high or (cp and replicas % 2 == 0):
            kind = "an odd number (etcd quorum)" if cp else "an integer"
            raise SpecError(f"replicas for {deployment}", replicas,
                            f"{kind} from {low} to {high} (at most {MAX_MACHINES} machines in all)")

    def set_replicas(self, deployment: str, replicas: int) -> None:
        """A MachineDeployment's desired replicas (checked by :meth:`check_replicas`)."""
        self.check_replicas(deployment, replicas)
        self.deployments[deployment].replicas = replicas

    def set_version(self, version: str) -> None:
        """The Kubernetes version the cluster runs now (after an upgrade)."""
        self.spec = self.spec.with_overrides(version=version)
        for md in self.deployments.values():
            md.version = version

    def mark_bootstrapped(self) -> None:
        self.bootstrapped = True

    # machines
    def machines(self, role: str | None = None, deployment: str | None = None) -> list[Machine]:
        ms = self.provider.list_machines(self.name, self.namespace)
        ms = [m for m in ms if m.role != "load-balancer"]
        if role:
            ms = [m for m in ms if m.role == role]
        if deployment:
            ms = [m for m in ms if m.deployment == deployment]
        return sorted(ms, key=lambda m: m.name)

    @property
    def control_planes(self) -> list[Machine]:
        return self.machines("control-plane")

    @property
    def workers(self) -> list[Machine]:
        return self.machines("worker")

    def machine(self, name: str) -> Machine:
        for m in self.machines():
            if m.name == name:
                return m
        raise KeyError(f"cluster {self.namespace}/{self.name} has no machine {name!r}; "
                       f"machines: {[m.name for m in self.machines()]}")

    def load_balancer(self) -> Machine | None:
        lbs = [m for m in self.provider.list_machines(self.name, self.namespace) if m.role == "load-balancer"]
        return lbs[0] if lbs else None

    def exec(self, machine: Machine | str, cmd: Sequence[str] | str, **kw: Any) -> ExecResult:
        m = self.machine(machine) if isinstance(machine, str) else machine
        if isinstance(cmd, str):
            cmd = ["bash", "-c", cmd]
        return self.provider.exec(m, list(cmd), **kw)

    def load_images(self, *tags: str) -> dict[str, list[str]]:
        """Put local Docker images into every node's containerd (``kind load docker-image``);
        returns machine -> the tags it lacked. See :mod:`harness.images_load`."""
        from .images_load import load_images
        return load_images(self, tags)

    # kubeconfig and clients
    @property
    def kubeconfig_path(self) -> Path:
        return self.state_dir / "kubeconfig"

    def set_kubeconfig(self, text: str) -> Path:
        """The admin kubeconfig (0600); API clients made before are dropped. Returns its path."""
        write_private(self.kubeconfig_path, text)
        self._client = None
        return self.kubeconfig_path

    @property
    def kubeconfig(self) -> str:
        if not self.kubeconfig_path.exists():
            raise RuntimeError(f"cluster {self.namespace}/{self.name} is not bootstrapped: no kubeconfig")
        return self.kubeconfig_path.read_text()

    def api_client(self):
        """A ``kubernetes.client.ApiClient`` for this cluster (admin)."""
        if self._client is None:
            from kubernetes import config as kconfig
            self._client = kconfig.new_client_from_config(str(self.kubeconfig_path))
        return self._client

    @property
    def core(self):
        from kubernetes import client
        return client.CoreV1Api(self.api_client())

    @property
    def apps(self):
        from kubernetes import client
        return client.AppsV1Api(self.api_client())

    def kubectl(self, *args: str, machine: Machine | None = None, check: bool = True,
                input: bytes | None = None, timeout: float | None = 120) -> ExecResult:
        """Run kubectl on a control-plane machine with the admin kubeconfig."""
        m = machine or self.control_planes[0]
        return self.provider.exec(m, ["kubectl", "--kubeconfig=/etc/kubernetes/admin.conf", *args],
                                  check=check, input=input, timeout=timeout)

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig_path)}

    def __repr__(self) -> str:
        return f"<Cluster {self.namespace}/{self.name} {self.spec.version} via {self.provider.name}>"
