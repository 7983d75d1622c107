"""kubeadm bootstrapper: turns booted node machines into a cluster.

Implements the controller's ``Bootstrapper`` protocol (``image``, ``init``,
``join``, ``ready``, ``remove``) the way kind and kinder drive kubeadm, by
running the ordered actions of :mod:`harness.kubeadm.actions` on one shared
:class:`~harness.kubeadm.actions.context.ActionContext` per call:

* ``image``: :mod:`.actions.image`
* ``init``: :mod:`.actions.kubeadm_config`, :mod:`.actions.kubeadm_init`
* ``join``: :mod:`.actions.join`
* ``ready``: :mod:`.actions.ready` (the CNI on every node, once all have
  their podCIDRs: joins do not wait for it, so they overlap the wait)
* ``remove``: :mod:`.actions.remove`

Preflight runs, ignoring only the checks that fail in any node container
and, on a cgroup v1 host, SystemVerification (:mod:`.preflight`).
"""
from __future__ import annotations

import os

from harness.cluster import Cluster
from providers.base import Machine

from .actions import join, kubeadm_config, kubeadm_init, ready, remove
from .actions.context import ActionContext, KubeadmError, Options
from .actions.image import ImageAction, check_host_limits

#: init's actions, in order; each takes the context and the first control plane
INIT_ACTIONS = (kubeadm_config.run, kubeadm_init.run)


class KubeadmBootstrapper:
    """Bootstraps clusters with kubeadm; see the module docs."""

    name = "kubeadm"

    def __init__(self, node_image: str | None = None, *, verbosity: int | None = None,
                 init_timeout: float = 600, join_timeout: float = 600, ready_timeout: float = 300,
                 join_parallelism: int = 4):
        self.options = Options(
            verbosity=int(os.environ.get("KUBE_HARNESS_KUBEADM_V", "1") if verbosity is None else verbosity),
            init_timeout=init_timeout, join_timeout=join_timeout, ready_timeout=ready_timeout,
            join_parallelism=join_parallelism)
        self.images = ImageAction(node_image)

    @property
    def node_image(self) -> str | None:
        return self.images.node_image

    def context(self, cluster: Cluster) -> ActionContext:
        return ActionContext(cluster, self.options)

    def image(self, cluster: Cluster) -> str:
        return self.images.image(cluster)

    def init(self, cluster: Cluster, machine: Machine) -> None:
        check_host_limits(cluster)
        ctx = self.context(cluster)
        for action in INIT_ACTIONS:
            action(ctx, machine)

    def join(self, cluster: Cluster, machines: list[Machine]) -> None:
        join.run(self.context(cluster), machines)

    def ready(self, cluster: Cluster) -> None:
        ready.run(self.context(cluster))

    def wait_system_pods(self, cluster: Cluster) -> None:
        """kube-proxy on every machine, every control plane's static pods and CoreDNS Ready
        (for clusters another controller bootstrapped with kubeadm)."""
        ready.wait_system_pods(self.context(cluster))

    def remove(self, cluster: Cluster, machine: Machine) -> None:
        remove.run(self.context(cluster), machine)


__all__ = ["KubeadmBootstrapper", "KubeadmError"]
