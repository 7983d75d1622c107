"""The machine controller: reconciles a Cluster's MachineDeployments into
machines through a provider, and bootstraps them (kubeadm, or nothing).

Provisioning is all-or-nothing: when any step fails the cluster's objects are
deleted (unless the owner asked to keep them), so no half-made cluster stays.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import secrets
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Protocol

from filelock import FileLock

from providers.base import (L_CLUSTER, L_KEEP, L_NAMESPACE, L_OWNER_HOST, L_OWNER_PID, L_RUN, Cleanup, Exec, Machine,
                            MachineProvider, Machines, MachineSpec, NodeImages, Owner, Provisioning, require)

from . import interrupts
from .cluster import Cluster, MachineDeployment
from .progress import phase
from .spec import ClusterSpec

log = logging.getLogger("harness.controller")


class Bootstrapper(Protocol):
    """Turns booted machines into a cluster (kubeadm) or leaves them bare."""
    name: str

    def image(self, cluster: Cluster) -> str: ...

    def init(self, cluster: Cluster, machine: Machine) -> None: ...

    def join(self, cluster: Cluster, machines: list[Machine]) -> None: ...

    def ready(self, cluster: Cluster) -> None: ...

    def remove(self, cluster: Cluster, machine: Machine) -> None: ...


class NoBootstrap:
    """Machines only: boots the provider's base image and nothing more."""
    name = "none"

    def image(self, cluster: Cluster) -> str:
        require(cluster.provider, NodeImages, needed_for="the image of machines without Kubernetes")
        return cluster.provider.node_image(None, **cluster.spec.provider_options)

    def init(self, cluster: Cluster, machine: Machine) -> None:
        pass

    def join(self, cluster: Cluster, machines: list[Machine]) -> None:
        pass

    def ready(self, cluster: Cluster) -> None:
        pass

    def remove(self, cluster: Cluster, machine: Machine) -> None:
        pass


class ProvisionError(RuntimeError):
    pass


class ClusterInUse(ProvisionError):
    """The cluster's name is taken: nothing of it may be deleted by this provisioning."""


def machine_name(deployment: str) -> str:
    return f"{deployment}-{secrets.token_hex(3)[:5]}"


class MachineController:
    def __init__(self, provider: MachineProvider, owner: Owner, bootstrapper: Bootstrapper | None = None,
                 parallelism: int = 4):
        self.provider = require(provider, Machines, Provisioning, Exec, Cleanup, needed_for="making clusters")
        self.owner = owner
        self.bootstrapper = bootstrapper or NoBootstrap()
        self.parallelism = parallelism

    # whole clusters
    def provision(self, spec: ClusterSpec, *, keep_on_failure: bool = False,
                  on_failure: Callable[[Cluster], None] | None = None) -> Cluster:
        cluster = Cluster(spec, self.provider, self.owner)
        self._refuse_existing(spec)
        t0 = time.monotonic()
        try:
            with phase("image", cluster=spec.name, timings=cluster.timings):
                image = self.bootstrapper.image(cluster)
            with phase("infrastructure", cluster=spec.name, timings=cluster.timings):
                self._claim(spec)
            with phase("machines", cluster=spec.name, timings=cluster.timings):
                created = self._create(cluster, list(cluster.deployments.values()), image)
            first = sorted((m for m in created if m.role == "control-plane"), key=lambda m: m.name)[0]
            rest = [m for m in created if m.name != first.name]
            with phase("init", cluster=spec.name, machine=first.name, timings=cluster.timings):
                self.bootstrapper.init(cluster, first)
            if rest:
                with phase("join", cluster=spec.name, timings=cluster.timings):
                    self.bootstrapper.join(cluster, rest)
            with phase("ready", cluster=spec.name, timings=cluster.timings):
                self.bootstrapper.ready(cluster)
        except ClusterInUse:
            raise  # another session's (or a kept) cluster: not ours to collect or delete
        except BaseException:
            if on_failure is not None:
                try:
                    on_failure(cluster)
                except Exception as e:
                    log.warning(f"collecting failure artifacts failed: {e}")
            if keep_on_failure or self.owner.keep:
                log.error("provisioning failed; keeping the cluster as asked", extra={"cluster": spec.name})
            else:
                self.teardown(cluster)
            raise
        if self.bootstrapper.name != "none":
            cluster.mark_bootstrapped()
        cluster.timings["provision"] = round(time.monotonic() - t0, 2)
        return cluster

    def _refuse_existing(self, spec: ClusterSpec) -> None:
        """A cluster of that name is someone's (another session's, a kept one): never touch it."""
        objs = self.provider.list_owned({L_CLUSTER: spec.name, L_NAMESPACE: spec.namespace})
        if objs:
            labels = objs[0].get("labels") or {}
            who = (f"run {labels.get(L_RUN, '?')} (pid {labels.get(L_OWNER_PID, '?')} on "
                   f"{labels.get(L_OWNER_HOST, '?')}{', kept' if labels.get(L_KEEP) == 'true' else ''})")
            raise ClusterInUse(f"cluster {spec.namespace}/{spec.name} already exists, made by {who}; use "
                               f"--reuse-cluster to share it, another name, or `kube-harness down {spec.name} "
                               f"-n {spec.namespace}`")

    def _claim(self, spec: ClusterSpec) -> None:
        """Check and make the cluster's infrastructure under a host-wide lock, so that of
        two sessions starting the same cluster at once one makes it and the other is refused."""
        locks = Path(tempfile.gettempdir()) / "kube-harness" / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with FileLock(str(locks / f"cluster-{spec.namespace}-{spec.name}.lock"), timeout=300):
            self._refuse_existing(spec)
            self.provider.ensure_infrastructure(spec.name, spec.namespace, self.owner, spec.ip_families)

    def exists(self, spec: ClusterSpec) -> bool:
        return bool(self.provider.list_machines(spec.name, spec.namespace))

    def adopt(self, spec: ClusterSpec) -> Cluster:
        """A handle on an existing cluster (--reuse-cluster, xdist workers)."""
        cluster = Cluster(spec, self.provider, self.owner)
        if not cluster.machines():
            raise ProvisionError(f"no machines found for cluster {spec.namespace}/{spec.name}")
        if cluster.kubeconfig_path.exists():
            cluster.mark_bootstrapped()
        return cluster

    def teardown(self, cluster: Cluster | ClusterSpec) -> list[str]:
        name, ns = cluster.name, cluster.namespace
        with interrupts.deferred(f"teardown of {ns}/{name}"), phase("teardown", cluster=name):
            deleted = self.provider.delete_owned({L_CLUSTER: name, L_NAMESPACE: ns})
            Cluster.forget(name, ns)
        return deleted

    # MachineDeployment reconciliation
    def _create(self, cluster: Cluster, deployments: Iterable[MachineDeployment], image: str) -> list[Machine]:
        specs: list[MachineSpec] = []
        for md in deployments:
            have = len(cluster.machines(deployment=md.name))
            for _ in range(max(0, md.replicas - have)):
                specs.append(MachineSpec(name=machine_name(md.name), cluster=cluster.name,
                                         namespace=cluster.namespace, role=md.role, deployment=md.name,
                                         image=image, owner=self.owner, labels=md.labels,
                                         options=cluster.spec.provider_options))
        return self._boot(cluster, specs)

    def _boot(self, cluster: Cluster, specs: list[MachineSpec]) -> list[Machine]:
        if not specs:
            return []

        def one(s: MachineSpec) -> Machine:
            with phase("machine-start", cluster=cluster.name, machine=s.name, timings=cluster.timings):
                m = self.provider.create_machine(s)
                self.provider.wait_booted(m)
                return self.provider.get_machine(m.name) or m

        return _parallel(one, specs, self.parallelism)

    def scale(self, cluster: Cluster, deployment: str, replicas: int) -> list[Machine]:
        """Set a MachineDeployment's replicas; returns created machines.
        Scaling down drains and removes the machines beyond the count."""
        if deployment not in cluster.deployments:
            raise KeyError(f"no MachineDeployment {deployment!r}; have {sorted(cluster.deployments)}")
        cluster.set_replicas(deployment, replicas)  # checked before anything is created or deleted
        return self.reconcile(cluster)

    def reconcile(self, cluster: Cluster) -> list[Machine]:
        """Create missing machines (joining them) and remove extra ones."""
        created: list[Machine] = []
        image = self.bootstrapper.image(cluster)
        for md in cluster.deployments.values():
            have = cluster.machines(deployment=md.name)
            for m in sorted(have, key=lambda m: m.name)[md.replicas:]:
                self.delete_machine(cluster, m)
        new = self._create(cluster, list(cluster.deployments.values()), image)
        if new:
            with phase("join", cluster=cluster.name):
                self.bootstrapper.join(cluster, new)
            with phase("ready", cluster=cluster.name):
                self.bootstrapper.ready(cluster)
            created.extend(new)
        return created

    def delete_machine(self, cluster: Cluster, machine: Machine, drain: bool = True) -> None:
        with phase("machine-delete", cluster=cluster.name, machine=machine.name):
            if drain:
                try:
                    self.bootstrapper.remove(cluster, machine)
                except Exception as e:  # a dead machine cannot be drained
                    log.warning(f"remove from cluster failed: {e}", extra={"machine": machine.name})
            self.provider.delete_machine(machine)

    def remediate(self, cluster: Cluster, machine: Machine) -> list[Machine]:
        """Replace an unhealthy machine, as a MachineHealthCheck would."""
        self.delete_machine(cluster, machine)
        return self.reconcile(cluster)


def _parallel(fn: Callable, items: list, n: int) -> list:
    if len(items) == 1:
        return [fn(items[0])]
    with cf.ThreadPoolExecutor(max_workers=min(n, len(items))) as ex:
        futs = [ex.submit(fn, i) for i in items]
        errors = []
        out = []
        for f in futs:
            try:
                out.append(f.result())
            except BaseException as e:
                errors.append(e)
        if errors:
            raise errors[0]
        return out
