"""The fixtures' cluster factory: clusters provisioned by the controller of
the session's mode (direct, or Cluster API's) and all torn down at the end
of their scope, artifacts collected on failure, --keep-cluster honoured."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from . import artifacts, interrupts, reaper
from .cluster import Cluster
from .controller import MachineController, NoBootstrap
from .progress import log
from .session import provider_for, run_id, session_spec
from .spec import ClusterSpec, load


def _bootstrapper(kind: str, config: pytest.Config):
    if kind == "none":
        return NoBootstrap()
    if kind == "kubeadm":
        from .kubeadm.bootstrap import KubeadmBootstrapper
        return KubeadmBootstrapper(node_image=config.getoption("node_image"))
    raise ValueError(f"bootstrap {kind!r}; allowed: kubeadm, none")


class TeardownError(RuntimeError):
    """Deleting a cluster left objects behind."""


class ClusterFactory:
    """Provision clusters and tear them all down at the end of the scope.

    With --cluster-api, kubeadm clusters come from Cluster API's controllers
    (the ``capi_management`` fixture); ``direct=True`` makes them directly anyway
    (the management cluster itself)."""

    def __init__(self, config: pytest.Config, request: pytest.FixtureRequest | None = None, *,
                 direct: bool = False):
        self.config = config
        self.request = request
        self.created: list[tuple[Any, Cluster]] = []
        self.keep = config.getoption("keep_cluster")
        self.cluster_api = bool(config.getoption("cluster_api")) and not direct

    def machine_controller(self, spec: ClusterSpec, bootstrap: str = "kubeadm", pid: int | None = None):
        """The controller that makes (and scales, repairs, deletes) this kind of cluster."""
        if self.cluster_api and bootstrap == "kubeadm":
            if self.request is None:
                raise RuntimeError("Cluster API mode needs a pytest request (for the capi_management fixture)")
            from .capi.controller import CapiController
            return CapiController(self.request.getfixturevalue("capi_management"), self.owner(pid))
        return MachineController(provider_for(self.config, spec), self.owner(pid), _bootstrapper(bootstrap, self.config))

    def owner(self, pid: int | None = None):
        return reaper.current_owner(run_id(self.config), keep=self.keep, pid=pid)

    def __call__(self, spec: ClusterSpec | str | Path | None = None, *, bootstrap: str = "kubeadm",
                 name: str | None = None, **overrides: Any) -> Cluster:
        skip_if_given_cluster(self.config)
        if spec is None:
            spec = session_spec(self.config)
        elif not isinstance(spec, ClusterSpec):
            spec = load(spec)
        if name:
            overrides["name"] = name
        if overrides:
            spec = spec.with_overrides(**overrides)
        ctl = self.machine_controller(spec, bootstrap)
        cluster = ctl.provision(spec, keep_on_failure=self.keep, on_failure=collect_on_failure)
        self.created.append((ctl, cluster))
        return cluster

    def controller(self, cluster: Cluster):
        """The machine controller that owns ``cluster`` (for scale/repair)."""
        for ctl, c in self.created:
            if c is cluster:
                return ctl
        raise KeyError(f"{cluster!r} was not made by this factory")

    def finish(self, failed: bool) -> None:
        names = ", ".join(f"{c.namespace}/{c.name}" for _, c in reversed(self.created))
        with interrupts.deferred(f"teardown of {names}"):  # all of them, then stop
            self._finish(failed)

    def _finish(self, failed: bool) -> None:
        errors: list[str] = []
        for ctl, cluster in reversed(self.created):
            if failed:
                artifacts.collect(cluster, reason="test failure")
            if self.keep:
                how = ("delete its Cluster object, or its management cluster with `kube-harness down`"
                       if self.cluster_api else f"`kube-harness down {cluster.name} -n {cluster.namespace}`")
                log.info(f"keeping cluster {cluster.namespace}/{cluster.name} (--keep-cluster); delete with {how}",
                         extra={"cluster": cluster.name})
                continue
            try:
                ctl.teardown(cluster)
            except Exception as e:  # the others are still torn down
                errors.append(f"{cluster.namespace}/{cluster.name}: {e}")
        self.created.clear()
        if errors:
            raise TeardownError("teardown failed, objects are left: " + "; ".join(errors))


def skip_if_given_cluster(config: pytest.Config) -> None:
    if config.getoption("kubeconfig"):
        pytest.skip("makes clusters or machines of its own; with --kubeconfig the harness creates and deletes "
                    "nothing")


def collect_on_failure(cluster: Cluster) -> None:
    artifacts.collect(cluster, reason="provisioning failed")
