"""The harness's pytest options and their checks: every option is checked
once, before anything is made, and a bad one is a usage error naming the
option, the value and what is allowed."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from providers import registry

from . import versions
from .session import provider_for, session_spec
from .spec import ClusterSpec, SpecError

ROOT = Path(__file__).resolve().parent.parent  # the checkout, or site-packages (configs/ is package data)
DEFAULT_CONFIG = ROOT / "configs" / "default.yaml"


def add_options(parser: pytest.Parser) -> None:
    """The harness's pytest options (the plugin's pytest_addoption)."""
    g = parser.getgroup("kube-harness", "Kubernetes cluster harness")
    g.addoption("--cluster-config", default=os.environ.get("KUBE_HARNESS_CONFIG", str(DEFAULT_CONFIG)),
                help="cluster spec YAML (default configs/default.yaml, env KUBE_HARNESS_CONFIG)")
    g.addoption("--provider", default=None, help="override spec.provider.name (registered: %s)"
                % ", ".join(registry.names()))
    g.addoption("--kubernetes-version", default=None, help="override spec.topology.version")
    g.addoption("--node-image", default=None, help="use this prebuilt node image instead of building one")
    g.addoption("--keep-cluster", action="store_true", help="do not delete clusters at the end (or on failure)")
    g.addoption("--reuse-cluster", action="store_true",
                help="reuse a running cluster with the spec's name/namespace if there is one; never delete it")
    g.addoption("--cluster-scope", choices=("shared", "worker"), default="shared",
                help="with xdist: one cluster shared by all workers (default) or one per worker")
    g.addoption("--no-reap", action="store_true", help="do not remove objects left by dead runs")
    e = parser.getgroup("kube-harness-existing", "A cluster the harness did not make")
    e.addoption("--kubeconfig", default=os.environ.get("KUBE_HARNESS_KUBECONFIG") or None,
                help="run the suites on the cluster this kubeconfig reaches (env KUBE_HARNESS_KUBECONFIG): no "
                     "machine is created or deleted; tests that make clusters of their own skip")
    e.addoption("--machine-access", choices=("auto", "none"), default="auto",
                help="with --kubeconfig: reach nodes through the provider of their providerID (auto), or never "
                     "(none: tests that need a node's shell skip)")
    c = parser.getgroup("kube-harness-capi", "Cluster API mode: the cluster fixtures' clusters come from Cluster API")
    c.addoption("--cluster-api", action="store_true", default=os.environ.get("KUBE_HARNESS_CLUSTER_API") == "1",
                help="make the kubeadm clusters through Cluster API (env KUBE_HARNESS_CLUSTER_API=1): the harness's "
                     "own management cluster with the providers it builds (CAPD), or --capi-management-kubeconfig")
    c.addoption("--capi-management-kubeconfig", default=None,
                help="a management cluster where your providers run (instead of the harness's own)")
    c.addoption("--capi-clusterctl-config", default=None,
                help="clusterctl config naming the provider repositories (for clusterctl generate cluster)")
    c.addoption("--capi-infrastructure", default=None, help="clusterctl --infrastructure NAME[:VERSION]")
    c.addoption("--capi-flavor", default=None, help="cluster template flavor (clusterctl --flavor)")
    c.addoption("--capi-template", default=None, help="cluster template file or URL (clusterctl --from)")
    c.addoption("--capi-var", action="append", default=[], metavar="NAME=VALUE",
                help="a cluster template variable (repeatable)")
    c.addoption("--capi-container-nodes", action="store_true",
                help="the workload's machines are containers on this host: patch kubeadm for them (the "
                     "harness's own management cluster does this itself)")


def check_options(config: pytest.Config) -> None:
    if config.getoption("kubeconfig"):
        _check_existing_options(config)
        return
    if config.getoption("machine_access") != "auto":
        raise SpecError("--machine-access", config.getoption("machine_access"), "only with --kubeconfig")
    provider, version = config.getoption("provider"), config.getoption("kubernetes_version")
    if provider and provider not in registry.names():
        raise SpecError("--provider", provider, f"one of {registry.names()}")
    if version and (why := versions.problem(version)):
        raise SpecError("--kubernetes-version", version, why)
    spec = session_spec(config)  # --cluster-config: an existing, valid spec
    from .build.nodeimage import check_option
    check_option(config.getoption("node_image"), provider_for(config, spec))
    _check_capi_options(config, spec)
    if not config.getoption("cluster_api"):
        from .kubeadm.validate import check_kubeadm_patches
        check_kubeadm_patches(spec)  # again after the build, if this host has no kubeadm yet


#: options about making clusters, which a given cluster (--kubeconfig) has no use for
MAKING_OPTIONS = ("provider", "kubernetes_version", "node_image", "keep_cluster", "reuse_cluster", "cluster_api")


def _check_existing_options(config: pytest.Config) -> None:
    given = [o for o in MAKING_OPTIONS if config.getoption(o)]
    if given:
        raise SpecError("--" + given[0].replace("_", "-"), config.getoption(given[0]),
                        "nothing with --kubeconfig: the harness makes no cluster, it uses the given one")
    session_spec(config)  # a readable kubeconfig, a cluster that answers, a supported version


CAPI_OPTIONS = ("capi_management_kubeconfig", "capi_clusterctl_config", "capi_infrastructure", "capi_flavor",
                "capi_template", "capi_var", "capi_container_nodes")


def _check_capi_options(config: pytest.Config, spec: ClusterSpec) -> None:
    opt = config.getoption
    if not opt("cluster_api"):
        given = [o for o in CAPI_OPTIONS if opt(o)]
        if given:
            raise SpecError("--" + given[0].replace("_", "-"), opt(given[0]), "only with --cluster-api")
        return
    if getattr(config.option, "numprocesses", None):
        raise SpecError("--cluster-api", True, "without xdist (-n) for now")
    for v in opt("capi_var"):
        if "=" not in v or not v.split("=", 1)[0].replace("_", "").isalnum():
            raise SpecError("--capi-var", v, "NAME=VALUE with NAME made of letters, digits and _")
    from .capi.controller import check_spec
    from .capi.management import BUILT_SUPPORTS, check_external
    if opt("capi_management_kubeconfig"):
        check_external(opt("capi_management_kubeconfig"), opt("capi_clusterctl_config"), opt("capi_template") or "")
        check_spec(spec, None)
        return
    for o in ("capi_clusterctl_config", "capi_template", "capi_infrastructure", "capi_container_nodes"):
        if opt(o):
            raise SpecError("--" + o.replace("_", "-"), opt(o), "only with --capi-management-kubeconfig (the "
                            "harness's own management cluster uses the providers it builds)")
    check_spec(spec, BUILT_SUPPORTS)
