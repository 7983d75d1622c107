"""Cluster API management-mode suite.

By default the management cluster is the harness's own ``cluster`` fixture
(a real kubeadm cluster): the suite installs the Cluster API CRDs (real ones,
fetched by release) and the harness's infrastructure CRDs, starts the
harness's Docker machine controller twice (two processes, one leader), and
drives a workload Cluster through Cluster API objects.

A provider author points the suite at their own management cluster, where
their controllers (and CAPI core) run::

    pytest suites/capi --management-kubeconfig ~/.kube/mgmt \\
        --capi-infra infrastructure.example.com/v1beta1/ExampleCluster/ExampleMachineTemplate \\
        --capi-infra-objects my-infra.yaml

The harness then only applies objects and waits for them to be reconciled:
``--capi-infra-objects`` is a YAML file of their infrastructure objects (an
``ExampleCluster`` named ``${CLUSTER_NAME}`` and one machine template per
MachineDeployment named ``${CLUSTER_NAME}-control-plane`` /
``${CLUSTER_NAME}-md-0``; ``${NAMESPACE}`` is substituted too).
``--capi-controllers harness`` starts the harness's controllers against a
given management cluster as well (their Docker machines are then made on
this host).

These options are read from this conftest, so give ``suites/capi`` (or a
file in it) on the command line.
"""
from __future__ import annotations

import os
import signal
import string
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from harness.capi import crds as capi_crds
from harness.capi.controller import LEASE_NAME
from harness.capi.deploy import DOCKER_SOCKET_MOUNT
from harness.capi.management import ManagementCluster
from harness.capi.objects import HARNESS_DOCKER, InfraKinds
from harness.progress import artifacts_dir, log
from harness.spec import ClusterSpec, parse

ROOT = Path(__file__).resolve().parents[2]


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("kube-harness-capi", "Cluster API management mode (suites/capi)")
    g.addoption("--management-kubeconfig", default=os.environ.get("KUBE_HARNESS_MANAGEMENT_KUBECONFIG"),
                help="use this Cluster API management cluster (with its own controllers) instead of the "
                     "harness's cluster fixture + the harness's Docker machine controller")
    g.addoption("--capi-controllers", choices=("auto", "harness", "external"), default="auto",
                help="who reconciles: the harness's controller processes (started by the suite) or external "
                     "ones already running; auto = harness unless --management-kubeconfig is given")
    g.addoption("--capi-infra", default=None,
                help="infrastructure kinds of an external provider: GROUP/VERSION/ClusterKind/MachineTemplateKind")
    g.addoption("--capi-infra-objects", default=None,
                help="YAML file of the external provider's infrastructure objects (${CLUSTER_NAME}, ${NAMESPACE})")
    g.addoption("--capi-timeout", type=float, default=900, help="seconds to wait for each reconciliation")
    g.addoption("--capi-release", default=None, help="Cluster API release whose CRDs are installed (default "
                                                     f"{capi_crds.release()})")


@pytest.fixture(scope="session")
def capi_options(pytestconfig: pytest.Config) -> dict:
    o = pytestconfig.getoption
    external_mgmt = bool(o("management_kubeconfig"))
    mode = o("capi_controllers")
    harness_ctl = mode == "harness" or (mode == "auto" and not external_mgmt)
    infra = HARNESS_DOCKER
    if o("capi_infra"):
        parts = o("capi_infra").split("/")
        if len(parts) != 4:
            raise pytest.UsageError("--capi-infra: expected GROUP/VERSION/ClusterKind/MachineTemplateKind")
        infra = InfraKinds(f"{parts[0]}/{parts[1]}", parts[2], parts[3].replace("Template", ""), parts[3])
    if harness_ctl and not infra.ours:
        raise pytest.UsageError("--capi-infra names another provider's kinds: use --capi-controllers external")
    return {"external_mgmt": external_mgmt, "harness_controllers": harness_ctl, "infra": infra,
            "infra_objects": o("capi_infra_objects"), "timeout": o("capi_timeout"), "release": o("capi_release")}


@pytest.fixture(scope="session")
def capi_management(request: pytest.FixtureRequest, capi_options: dict) -> ManagementCluster:
    """The management cluster, with the CRDs the suite needs installed."""
    kc = request.config.getoption("management_kubeconfig")
    if kc:
        mgmt = ManagementCluster(kc)
    else:
        mgmt = ManagementCluster.of(request.getfixturevalue("cluster"))
    t0 = time.monotonic()
    if capi_options["harness_controllers"] or not mgmt.crds_installed():
        # never re-apply CAPI's CRDs over a real Cluster API installation (clusterctl owns those)
        mgmt.install_crds(capi_options["release"], ours=capi_options["infra"].ours)
    elif capi_options["infra"].ours:
        mgmt.apply_crds(capi_crds.harness_crds())
    log.info(f"CRDs ready in {time.monotonic() - t0:.1f}s on {mgmt}")
    return mgmt


@pytest.fixture(scope="session")
def capi_namespace() -> str:
    return f"kh-capi-{uuid.uuid4().hex[:4]}"


@pytest.fixture(scope="session")
def capi_spec(capi_namespace: str, cluster_spec: ClusterSpec) -> ClusterSpec:
    """The workload cluster: one control plane, one worker (md-0), nodes with the Docker socket."""
    return parse({"apiVersion": "harness.k8s.io/v1alpha1", "kind": "Cluster",
                  "metadata": {"name": "kh-wl", "namespace": capi_namespace},
                  # the host's Docker socket in the nodes: after the pivot, the controller runs as a
                  # Deployment inside this cluster (node containers are privileged anyway)
                  "spec": {"provider": {"name": "docker", "options": {
                               **dict(cluster_spec.provider_options),
                               "extra_mounts": [*(cluster_spec.provider_options.get("extra_mounts") or []),
                                                DOCKER_SOCKET_MOUNT]}},
                           "clusterNetwork": {"pods": "10.200.0.0/16", "services": "10.201.0.0/16"},
                           "topology": {"version": cluster_spec.version, "controlPlane": {"replicas": 1},
                                        "workers": {"machineDeployments": [{"name": "md-0", "replicas": 1}]}}}},
                 "suites/capi", providers={"docker"})


@pytest.fixture(scope="session")
def capi_extra_objects(capi_options: dict, capi_spec: ClusterSpec) -> list[dict]:
    path = capi_options["infra_objects"]
    if not path:
        if not capi_options["infra"].ours:
            raise pytest.UsageError("--capi-infra needs --capi-infra-objects (the provider's infrastructure objects)")
        return []
    text = string.Template(Path(path).read_text()).safe_substitute(CLUSTER_NAME=capi_spec.name,
                                                                   NAMESPACE=capi_spec.namespace)
    return [d for d in yaml.safe_load_all(text) if d]


class ControllerProcess:
    """One ``python -m harness.capi.controller`` subprocess."""

    def __init__(self, identity: str, kubeconfig: str, namespace: str, *, node_image: str | None,
                 run_id: str, lease: tuple[float, float, float] = (10, 6, 1)):
        self.identity = identity
        self.log_path = artifacts_dir() / f"capi-controller-{identity}.log"
        self.json_path = artifacts_dir() / f"capi-controller-{identity}.jsonl"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "harness.capi.controller", "--kubeconfig", kubeconfig,
               "--namespace", namespace, "--identity", identity,
               "--lease-duration", str(lease[0]), "--renew-deadline", str(lease[1]), "--retry-period", str(lease[2]),
               "--sync-period", "2", "--owner-pid", str(os.getpid()), "--run-id", run_id,
               "--log-file", str(self.json_path)]
        if node_image:
            cmd += ["--node-image", node_image]
        self._out = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=str(ROOT), stdout=self._out, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.started = time.monotonic()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 60) -> int | None:
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._out.close()
        return self.proc.returncode

    def log_text(self) -> str:
        self._out.flush()
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Controllers:
    def __init__(self, mgmt: ManagementCluster, namespace: str, procs: list[ControllerProcess], lease_duration: float):
        self.mgmt, self.namespace, self.procs, self.lease_duration = mgmt, namespace, procs, lease_duration

    def holder(self) -> str | None:
        return self.mgmt.lease_holder(LEASE_NAME, self.namespace)

    def by_identity(self, identity: str) -> ControllerProcess:
        return next(p for p in self.procs if p.identity == identity)


@pytest.fixture(scope="session")
def capi_controllers(request: pytest.FixtureRequest, capi_options: dict, capi_management: ManagementCluster,
                     capi_namespace: str) -> Iterator[Controllers | None]:
    """The harness's controller, started twice (None with external controllers)."""
    if not capi_options["harness_controllers"]:
        yield None
        return
    from harness.plugin import run_id
    capi_management.ensure_namespace(capi_namespace)
    tag = uuid.uuid4().hex[:4]
    procs = [ControllerProcess(f"ctl-{c}-{tag}", capi_management.kubeconfig, capi_namespace,
                               node_image=request.config.getoption("node_image"), run_id=run_id(request.config))
             for c in ("a", "b")]
    ctl = Controllers(capi_management, capi_namespace, procs, lease_duration=10)
    try:
        yield ctl
    finally:
        for p in procs:
            code = p.stop()
            log.info(f"controller {p.identity} exited {code}")
