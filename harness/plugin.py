"""pytest plugin: the hooks and fixtures (``cluster``, ``cluster_factory``,
``machines``, ``capi_management``): teardown, reaping, failure artifacts and
Prow-style JUnit. The options are :mod:`harness.session_options`, the run's
identity and spec :mod:`harness.session`, the factory
:mod:`harness.cluster_factory`.

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

from providers.base import L_KEEP, L_RUN

from . import artifacts, interrupts, junit, metadata, reaper
from .cluster import Cluster
from .cluster_factory import ClusterFactory, collect_on_failure, skip_if_given_cluster
from .controller import MachineController
from .progress import artifacts_dir, configure, log, use_capture_manager
from .reached import NoMachineAccess
from .session import is_worker, provider_for, run_dir, run_id, session_spec
from .session_options import add_options, check_options
from .spec import ClusterSpec, SpecError, load

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
    add_options(parser)


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
    if not is_worker(config):
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
        check_options(config)
    except SpecError as e:
        raise pytest.UsageError(str(e)) from None


def _suite_name(config: pytest.Config) -> str:
    args = [a for a in config.args if not a.startswith("-")]
    names = sorted({Path(a.split("::")[0]).name.replace(".py", "") for a in args}) or ["tests"]
    return "_".join(names)[:60]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist master -> worker: share the run id and the master pid."""
    node.workerinput["kh_run_id"] = node.config._kh_run_id
    node.workerinput["kh_master_pid"] = os.getpid()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """A worker went down: reap what its process owned if it is dead."""
    if error and not node.config.getoption("no_reap"):
        try:
            spec = session_spec(node.config)
            reaper.reap(provider_for(node.config, spec))
        except Exception as e:
            log.warning(f"reaping after worker crash failed: {e}")


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if is_worker(config) or config.getoption("no_reap") or config.getoption("collectonly") \
            or config.getoption("kubeconfig"):
        return
    try:
        reaper.reap(provider_for(config, session_spec(config)))
    except Exception as e:  # no docker: tests that need it fail with a clear error
        log.warning(f"reaper skipped: {e}")


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Iterator[None]:
    """After pytest's own sessionfinish, even when that raised: after a Ctrl-C in a test,
    pytest tears the session's fixtures (its clusters) down there."""
    try:
        return (yield)
    finally:
        _finish_session(session, exitstatus)


def _finish_session(session: pytest.Session, exitstatus: int) -> None:
    """The master deletes the shared clusters of this run (xdist), then looks for
    anything of this run left behind (a failed teardown or a leftover fails the
    run) and writes $ARTIFACTS/metadata.json; interrupts wait until that is done."""
    config = session.config
    if is_worker(config):
        return
    with interrupts.deferred("the end of the session"):
        problems = _delete_shared_clusters(config, exitstatus)
        if not config.getoption("kubeconfig") and not config.getoption("collectonly"):
            problems += _leftovers(config)
        shutil.rmtree(run_dir(config), ignore_errors=True)
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
        provider = provider_for(config, session_spec(config))
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
    for state in sorted(run_dir(config).glob("*.json")):
        info = json.loads(state.read_text())
        if info.get("keep"):
            continue
        try:
            spec = session_spec(config).with_overrides(name=info["name"])
            provider = provider_for(config, spec)
            cluster = Cluster(spec, provider, reaper.current_owner(run_id(config)))
            if exitstatus not in (0, 5):
                artifacts.collect(cluster, reason=f"pytest exit status {exitstatus}")
            MachineController(provider, cluster.owner).teardown(cluster)
            state.unlink()
        except Exception as e:
            problems.append(f"teardown of shared cluster {info.get('name')} failed: {e}")
    return problems


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
            skip_if_given_cluster(config)
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
        state = run_dir(config) / f"{spec.name}.json"
        master = config.workerinput["kh_master_pid"]
        with FileLock(str(state) + ".lock"):
            ctl = factory.machine_controller(spec, bootstrap, pid=master)
            if state.exists():
                cl = ctl.adopt(spec)
            else:
                with junit_rec.step("Up"):
                    cl = ctl.provision(spec, keep_on_failure=factory.keep, on_failure=collect_on_failure)
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
    skip_if_given_cluster(pytestconfig)
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
