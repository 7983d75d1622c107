"""A pytest session's identity and inputs: its run id (shared with xdist
workers), the validated cluster spec (--cluster-config with the command
line's overrides, or read from the cluster --kubeconfig reaches) and the
provider that spec names."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from providers import registry

from .spec import ClusterSpec, load


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def run_id(config: pytest.Config) -> str:
    if is_worker(config):
        return config.workerinput["kh_run_id"]
    return config._kh_run_id  # type: ignore[attr-defined]


def session_spec(config: pytest.Config) -> ClusterSpec:
    cached = getattr(config, "_kh_spec", None)
    if cached is not None:
        return cached
    if config.getoption("kubeconfig"):
        from .existing import describe
        spec = describe(config.getoption("kubeconfig"))
        config._kh_spec = spec  # type: ignore[attr-defined]
        return spec
    spec = load(config.getoption("cluster_config"))
    over: dict[str, Any] = {}
    if config.getoption("provider"):
        over["provider"] = config.getoption("provider")
    if config.getoption("kubernetes_version"):
        over["version"] = config.getoption("kubernetes_version")
    if over:
        spec = spec.with_overrides(**over)
    config._kh_spec = spec  # type: ignore[attr-defined]
    return spec


def provider_for(config: pytest.Config, spec: ClusterSpec):
    return registry.get(spec.provider, spec.provider_options)


def run_dir(config: pytest.Config) -> Path:
    """This run's directory on the host, shared by its xdist workers (removed at the end)."""
    base = Path(os.environ.get("TMPDIR", "/tmp")) / "kube-harness" / "runs" / run_id(config)
    base.mkdir(parents=True, exist_ok=True)
    return base
