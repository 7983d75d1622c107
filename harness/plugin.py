"""pytest plugin: options, the ``cluster`` fixtures, teardown, reaping,
failure artifacts and Prow-style JUnit.

Loaded through the ``pytest11`` entry point once the project is installed.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from filelock import FileLock

from providers import registry
from providers.base import L_KEEP, L_RUN

from . import artifacts, junit, metadata, reaper, versions
from .cluster import Cluster
from .controller import MachineController, NoBootstrap
from .progress import artifacts_dir, configure, log, use_capture_manager
from .reached import NoMachineAccess
from .spec import ClusterSpec, SpecError, load

ROOT = Path(__file__).resolve().parent.parent  # the checkout, or site-packages (configs/ is package data)
DEFAULT_CONFIG = ROOT / "configs" / "default.yaml"
MARKERS = (
    "cluster: needs a real kubeadm cluster (slow; selected in CI with -m cluster)",
    "docker: needs a real Docker engine",
    "slow: takes minutes",
    "conformance: runs the upstream e2e conformance binary",
    "lifecycle: mutates the cluster (scale, repair, faults)",
    "direct_mode: checks what the harness itself configures in direct mode (kubeadm settings, machines it makes); "
    "in Cluster API mode the cluster template decides, and the test is skipped",
)


def pytest_addoption(parser: pytest.Parser) -> None:
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


# --- run identity -------------------------------------------------------

def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def run_id(config: pytest.Config) -> str:
    if _is_worker(config):
        return config.workerinput["kh_run_id"]
    return config._kh_run_id  # type: ignore[attr-defined]


def _install_sigterm() -> None:
    """Prow and CI runners send SIGTERM: turn it into Ctrl-C so teardown runs."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    try:
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, handler)
    except ValueError:
        pass


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    configure()
    use_capture_manager(config.pluginmanager.getplugin("capturemanager"))
    if not _is_worker(config):
        _fail_on_bad_options(config)
        config._kh_run_id = os.environ.get("KUBE_HARNESS_RUN_ID") or uuid.uuid4().hex[:12]  # type: ignore
        # Prow layout: junit_*.xml under $ARTIFACTS when it is set
        if os.environ.get("ARTIFACTS") and not config.option.xmlpath:
            suite = _suite_name(config)
            config.option.xmlpath = str(artifacts_dir() / f"junit_{suite}.xml")
    _install_sigterm()
    config._kh_controllers = []  # type: ignore[attr-defined]


def _fail_on_bad_options(config: pytest.Config) -> None:
    """The controller checks every harness option once, before anything
    (workers, reaping, machines) starts: a usage error naming the option."""
    if config.option.help:
        return
    try:
        _check_options(config)
    except SpecError as e:
        raise pytest.UsageError(str(e)) from None


def _check_options(config: pytest.Config) -> None:
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
    check_option(config.getoption("node_image"), _provider_for(config, spec))
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


def _suite_name(config: pytest.Config) -> str:
    args = [a for a in config.args if not a.startswith("-")]
    names = sorted({Path(a.split("::")[0]).name.replace(".py", "") for a in args}) or ["tests"]
    return "_".join(names)[:60]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist master -> worker: share the run id and the master pid."""
    node.workerinput["kh_run_id"] = node.config._kh_run_id
    node.workerinput["kh_master_pid"] = os.getpid()


def _provider_for(config: pytest.Config, spec: ClusterSpec):
    return registry.get(spec.provider, spec.provider_options)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """A worker went down: reap what its process owned if it is dead."""
    if error and not node.config.getoption("no_reap"):
        try:
            spec = session_spec(node.config)
            reaper.reap(_provider_for(node.config, spec))
        except Exception as e:
            log.warning(f"reaping after worker crash failed: {e}")


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if _is_worker(config) or config.getoption("no_reap") or config.getoption("collectonly") \
            or config.getoption("kubeconfig"):
        return
    try:
        reaper.reap(_provider_for(config, session_spec(config)))
    except Exception as e:  # no docker: tests that need it fail with a clear error
        log.warning(f"reaper skipped: {e}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The master deletes the shared clusters of this run (xdist), then looks for
    anything of this run left behind (a failed teardown or a leftover fails the
    run) and writes $ARTIFACTS/metadata.json."""
    config = session.config
    if _is_worker(config):
        return
    problems = _delete_shared_clusters(config, exitstatus)
    if not config.getoption("kubeconfig") and not config.getoption("collectonly"):
        problems += _leftovers(config)
    shutil.rmtree(_shared_dir(config), ignore_errors=True)
    if problems:
        for p in problems:
            log.error(p)
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("=", "kube-harness: cleanup failed", red=True)
            for p in problems:
                reporter.write_line(p, red=True)
        if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    metadata.write_session(config)


def _leftovers(config: pytest.Config) -> list[str]:
    """Objects labelled with this run that no teardown took (not kept): deleted now, and named."""
    selector = {L_RUN: run_id(config), L_KEEP: "false"}
    try:
        provider = _provider_for(config, session_spec(config))
        left = provider.list_owned(selector)
    except Exception as e:
        return [f"could not check for leftovers of run {run_id(config)}: {e}"]
    if not left:
        return []
    names = sorted(f"{o['kind']}/{o['name']}" for o in left)
    try:
        provider.delete_owned(selector)
    except Exception as e:
        names.append(f"(and deleting them failed: {e})")
    return [f"leftovers of run {run_id(config)} at session end: {', '.join(names)}"]


def _delete_shared_clusters(config: pytest.Config, exitstatus: int) -> list[str]:
    problems = []
    for state in sorted(_shared_dir(config).glob("*.json")):
        info = json.loads(state.read_text())
        if info.get("keep"):
            continue
        try:
            spec = session_spec(config).with_overrides(name=info["name"])
            provider = _provider_for(config, spec)
            cluster = Cluster(spec, provider, reaper.current_owner(run_id(config)))
            if exitstatus not in (0, 5):
                artifacts.collect(cluster, reason=f"pytest exit status {exitstatus}")
            MachineController(provider, cluster.owner).teardown(cluster)
            state.unlink()
        except Exception as e:
            problems.append(f"teardown of shared cluster {info.get('name')} failed: {e}")
    return problems


# --- spec and controller ------------------------------------------------

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


def _bootstrapper(kind: str, config: pytest.Config):
    if kind == "none":
        return NoBootstrap()
    if kind == "kubeadm":
        from .kubeadm.bootstrap import KubeadmBootstrapper
        return KubeadmBootstrapper(node_image=config.getoption("node_image"))
    raise ValueError(f"bootstrap {kind!r}; allowed: kubeadm, none")


def _shared_dir(config: pytest.Config) -> Path:
    base = Path(os.environ.get("TMPDIR", "/tmp")) / "kube-harness" / "runs" / run_id(config)
    base.mkdir(parents=True, exist_ok=True)
    return base


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
        return MachineController(_provider_for(self.config, spec), self.owner(pid), _bootstrapper(bootstrap, self.config))

    def owner(self, pid: int | None = None):
        return reaper.current_owner(run_id(self.config), keep=self.keep, pid=pid)

    def __call__(self, spec: ClusterSpec | str | Path | None = None, *, bootstrap: str = "kubeadm",
                 name: str | None = None, **overrides: Any) -> Cluster:
        _skip_if_given_cluster(self.config)
        if spec is None:
            spec = session_spec(self.config)
        elif not isinstance(spec, ClusterSpec):
            spec = load(spec)
        if name:
            overrides["name"] = name
        if overrides:
            spec = spec.with_overrides(**overrides)
        ctl = self.machine_controller(spec, bootstrap)
        cluster = ctl.provision(spec, keep_on_failure=self.keep, on_failure=_collect_on_failure)
        self.created.append((ctl, cluster))
        return cluster

    def controller(self, cluster: Cluster):
        """The machine controller that owns ``cluster`` (for scale/repair)."""
        for ctl, c in self.created:
            if c is cluster:
                return ctl
        raise KeyError(f"{cluster!r} was not made by this factory")

    def finish(self, failed: bool) -> None:
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


def _skip_if_given_cluster(config: pytest.Config) -> None:
    if config.getoption("kubeconfig"):
        pytest.skip("makes clusters or machines of its own; with --kubeconfig the harness creates and deletes "
                    "nothing")


def _collect_on_failure(cluster: Cluster) -> None:
    artifacts.collect(cluster, reason="provisioning failed")


def _failed(session: pytest.Session, before: int = 0) -> bool:
    return session.testsfailed > before


@pytest.fixture
def cluster_factory(request: pytest.FixtureRequest) -> Iterator[ClusterFactory]:
    """Factory for tests that need clusters of their own: ``cluster_factory(spec, bootstrap=...)``."""
    f = ClusterFactory(request.config, request)
    before = request.session.testsfailed
    try:
        yield f
    finally:
        f.finish(_failed(request.session, before) or _item_failed(request))


def _item_failed(request: pytest.FixtureRequest) -> bool:
    rep = getattr(request.node, "_kh_rep_call", None)
    return bool(rep and rep.failed)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("direct_mode") and item.config.getoption("cluster_api"):
        pytest.skip("checks what the harness configures in direct mode; with --cluster-api the cluster "
                    "template (its KubeadmConfigSpec, its infrastructure) decides")
    if item.get_closest_marker("direct_mode") and item.config.getoption("kubeconfig"):
        pytest.skip("checks what the harness configures in direct mode; the cluster given by --kubeconfig was "
                    "made by someone else")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[Any]:
    """After an e2e suite's umbrella test ran, report each of its specs as a
    pytest test (``item._kh_e2e_specs = (suite, results)``)."""
    try:
        return (yield)
    finally:
        suite, results = getattr(item, "_kh_e2e_specs", ("", ()))
        if results:
            from .e2e_reports import emit_spec_reports
            emit_spec_reports(item, results, suite)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[Any]:
    rep = yield
    if call.excinfo is not None and isinstance(call.excinfo.value, NoMachineAccess) \
            and item.config.getoption("kubeconfig"):
        rep.outcome = "skipped"  # a given cluster whose nodes the harness cannot reach
        rep.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: needs machine access: {call.excinfo.value}")
    if rep.when == "call":
        item._kh_rep_call = rep  # type: ignore[attr-defined]
    return rep


@pytest.fixture(scope="session")
def cluster_spec(pytestconfig: pytest.Config) -> ClusterSpec:
    """The validated spec from --cluster-config (with command line overrides)."""
    return session_spec(pytestconfig)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, pytestconfig: pytest.Config) -> Iterator[Cluster]:
    """The session's kubeadm cluster, provisioned from --cluster-config."""
    yield from _session_cluster(request, pytestconfig, "kubeadm")


def _session_cluster(request: pytest.FixtureRequest, config: pytest.Config, bootstrap: str) -> Iterator[Cluster]:
    spec = session_spec(config)
    if config.getoption("kubeconfig"):
        if bootstrap != "kubeadm":
            _skip_if_given_cluster(config)
        from .existing import existing_cluster
        yield existing_cluster(config.getoption("kubeconfig"), reaper.current_owner(run_id(config)),
                               machine_access=config.getoption("machine_access") == "auto")
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    scope = config.getoption("cluster_scope")
    factory = ClusterFactory(config, request)
    reuse = config.getoption("reuse_cluster")
    junit_rec = junit.PhaseRecorder(f"{spec.namespace}-{spec.name}")

    if bootstrap == "none":
        spec = spec.with_overrides(name=f"{spec.name}-bare"[:40])
    if worker and scope == "worker":
        spec = spec.with_overrides(name=f"{spec.name}-{worker}"[:40])
    if reuse and (ctl := factory.machine_controller(spec, bootstrap)).exists(spec):
        log.info(f"reusing cluster {spec.namespace}/{spec.name}", extra={"cluster": spec.name})
        yield ctl.adopt(spec)
        return

    if worker and scope == "shared":
        # One cluster for the run: the first worker provisions it, owned by the master process.
        state = _shared_dir(config) / f"{spec.name}.json"
        master = config.workerinput["kh_master_pid"]
        with FileLock(str(state) + ".lock"):
            ctl = factory.machine_controller(spec, bootstrap, pid=master)
            if state.exists():
                cl = ctl.adopt(spec)
            else:
                with junit_rec.step("Up"):
                    cl = ctl.provision(spec, keep_on_failure=factory.keep, on_failure=_collect_on_failure)
                state.write_text(json.dumps({"name": spec.name, "namespace": spec.namespace,
                                             "keep": factory.keep}))
        yield cl
        return  # the master tears it down in pytest_sessionfinish

    with junit_rec.step("Up"):
        cl = factory(spec, bootstrap=bootstrap)
    t0 = time.monotonic()
    before = request.session.testsfailed
    try:
        yield cl
    finally:
        junit_rec.add("Test", time.monotonic() - t0, failed=_failed(request.session, before))
        with junit_rec.step("Down"):
            factory.finish(_failed(request.session, before))
        junit_rec.write(cl.timings)


@pytest.fixture(scope="session")
def capi_management(request: pytest.FixtureRequest, pytestconfig: pytest.Config):
    """The Cluster API management cluster of the session (--cluster-api): the harness's own
    (made directly, the providers it builds installed; deleted at the end) or the user's."""
    from .capi import management
    _skip_if_given_cluster(pytestconfig)
    opt = pytestconfig.getoption
    variables = dict(v.split("=", 1) for v in opt("capi_var"))
    if opt("capi_management_kubeconfig"):
        yield management.external(opt("capi_management_kubeconfig"), opt("capi_clusterctl_config"),
                                  flavor=opt("capi_flavor") or "", template=opt("capi_template") or "",
                                  infrastructure=opt("capi_infrastructure") or "",
                                  container_nodes=opt("capi_container_nodes"), variables=variables)
        return
    factory = ClusterFactory(pytestconfig, request, direct=True)
    before = request.session.testsfailed
    name = f"{session_spec(pytestconfig).name}-mgmt"[:40]
    spec = load(management.MANAGEMENT_CONFIG).with_overrides(name=name)
    direct = factory.machine_controller(spec)
    reuse = bool(opt("reuse_cluster")) and direct.exists(spec)
    try:
        if reuse:  # kept by an earlier --keep-cluster session: its providers are installed
            log.info(f"reusing management cluster {spec.namespace}/{name}", extra={"cluster": name})
            mgmt = management.own(direct.adopt, spec, install=False)
        else:
            mgmt = management.own(factory, spec)
        mgmt.clusterctl.variables.update(variables)
        if opt("capi_flavor"):
            mgmt.flavor = opt("capi_flavor")
        yield mgmt
    finally:
        if not factory.keep:
            from .capi.cleanup import delete_workloads  # what a failed teardown left, through the controllers
            for _, cl in factory.created:
                delete_workloads(cl.provider, cl.machines())
        factory.finish(_failed(request.session, before))


@pytest.fixture(scope="session")
def machines(request: pytest.FixtureRequest, pytestconfig: pytest.Config) -> Iterator[Cluster]:
    """Bare machines from the spec (no Kubernetes): for provider tests."""
    yield from _session_cluster(request, pytestconfig, "none")
