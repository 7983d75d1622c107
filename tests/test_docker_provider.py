"""DockerProvider against the real Docker engine: machines are systemd node
containers from the base image. Every test uses its own cluster name and
removes everything it made (the finally of the ``cluster`` fixture)."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

docker = pytest.importorskip("docker")

from providers import registry  # noqa: E402
from providers.base import (L_CLUSTER, L_DEPLOYMENT, L_NAMESPACE, L_ROLE, L_RUN, Cleanup, Exec,  # noqa: E402
                            ExecError, HostLimits, LoadBalancer, Machines, MachineSpec, NodeImages, Owner,
                            Provisioning)
from providers.docker import DockerProvider, ExecTimeout, lb_name, network_name, volume_name  # noqa: E402
from providers.docker.host import FREEZER, thaw  # noqa: E402
from providers.docker.nodeimage import build_base_image  # noqa: E402

pytestmark = pytest.mark.docker

NS = "pt"


@pytest.fixture(scope="module")
def client():
    try:
        c = docker.from_env()
        c.ping()
    except Exception as e:  # pragma: no cover
        pytest.skip(f"no Docker engine: {e}")
    yield c
    c.close()


@pytest.fixture(scope="module")
def image(client):
    return build_base_image()


@pytest.fixture(scope="module")
def provider(client):
    p = DockerProvider()
    yield p
    p.close()


def _owner() -> Owner:
    import psutil
    return Owner(run_id=f"test-{uuid.uuid4().hex[:8]}", pid=os.getpid(), host=socket.gethostname(),
                 started=int(psutil.Process().create_time()))


def leftovers(client, cluster: str) -> list[str]:
    f = {"label": [f"{L_CLUSTER}={cluster}"]}
    return ([f"container/{c.name}" for c in client.containers.list(all=True, filters=f)]
            + [f"network/{n.name}" for n in client.networks.list(filters=f)]
            + [f"volume/{v.name}" for v in client.volumes.list(filters=f)])


class Cluster:
    def __init__(self, provider: DockerProvider, image: str):
        self.provider, self.image = provider, image
        self.name = f"t{uuid.uuid4().hex[:8]}"
        self.namespace = NS
        self.owner = _owner()

    def spec(self, suffix: str, role: str = "worker", **options) -> MachineSpec:
        dep = f"{self.name}-{'control-plane' if role == 'control-plane' else 'md-0'}"
        return MachineSpec(name=f"{self.name}-{suffix}", cluster=self.name, namespace=self.namespace, role=role,
                           deployment=dep, image=self.image, owner=self.owner, labels={"test": "yes"},
                           options=options)

    def machine(self, suffix: str, role: str = "worker", **options):
        return self.provider.create_machine(self.spec(suffix, role, **options))


@pytest.fixture
def cluster(provider, image, client):
    c = Cluster(provider, image)
    provider.ensure_infrastructure(c.name, c.namespace, c.owner)
    try:
        yield c
    finally:
        provider.delete_owned({L_CLUSTER: c.name, L_NAMESPACE: c.namespace})
        assert leftovers(client, c.name) == []


def test_registered():
    p = registry.get("docker")
    assert isinstance(p, DockerProvider) and p.name == "docker"
    for capability in (Machines, Provisioning, Exec, LoadBalancer, Cleanup, NodeImages, HostLimits):
        assert isinstance(p, capability), capability.__name__


def test_machine_boots_systemd_and_containerd(provider, cluster, client):
    t0 = time.monotonic()
    m = cluster.machine("cp-1", "control-plane")
    boot = time.monotonic() - t0
    assert boot < 60, f"boot took {boot:.1f}s"
    assert m.state == "running" and m.role == "control-plane" and m.ip
    assert provider.health(m).booted
    state = provider.exec(m, ["systemctl", "is-system-running"], check=False).stdout.strip()
    failed = provider.exec(m, ["systemctl", "--failed", "--no-legend", "--plain"], check=False).stdout
    assert state in ("running", "degraded"), failed
    assert state == "running", f"failed units: {failed}"
    assert provider.exec(m, ["systemctl", "is-active", "containerd"]).stdout.strip() == "active"
    assert "Server:" in provider.exec(m, ["ctr", "version"]).stdout
    # containerd 2 and runc built from the Go module proxy, not Debian's
    from harness.build.runtime import RUNTIME_VERSIONS
    assert f" {RUNTIME_VERSIONS['containerd']} " in provider.exec(m, ["containerd", "--version"]).stdout
    assert RUNTIME_VERSIONS["runc"].lstrip("v") in provider.exec(m, ["runc", "--version"]).stdout
    assert provider.exec(m, ["sh", "-c", "dpkg -l containerd runc 2>&1 | grep -c '^ii'"], check=False).stdout.strip() \
        in ("", "0")
    assert provider.exec(m, ["hostname"]).stdout.strip() == m.name
    # the container is what the spec asked for: really privileged, as kind's and CAPD's nodes
    info = client.api.inspect_container(m.name)
    assert info["HostConfig"]["Privileged"] is True
    host_bnd = next(ln.split()[1] for ln in open("/proc/self/status") if ln.startswith("CapBnd:"))
    assert provider.exec(m, ["grep", "CapBnd", "/proc/1/status"]).stdout.split()[1] == host_bnd
    labels = info["Config"]["Labels"]
    assert labels[L_CLUSTER] == cluster.name and labels[L_NAMESPACE] == NS and labels["test"] == "yes"
    assert labels[L_ROLE] == "control-plane" and labels[L_RUN] == cluster.owner.run_id
    assert network_name(cluster.name, NS) in info["NetworkSettings"]["Networks"]
    assert info["HostConfig"]["RestartPolicy"] == {"Name": "on-failure", "MaximumRetryCount": 1}
    assert set(info["HostConfig"]["Tmpfs"]) == {"/tmp", "/run"}
    var = [mt for mt in info["Mounts"] if mt["Destination"] == "/var"]
    assert var and var[0]["Type"] == "volume" and var[0]["Name"] == volume_name(m.name)
    assert client.volumes.get(volume_name(m.name)).attrs["Labels"][L_CLUSTER] == cluster.name
    # the image's /var content was copied into the volume
    assert provider.exec(m, ["test", "-d", "/var/lib/kubelet"]).ok
    host, port = provider.host_endpoint(m, 6443)
    assert host == "127.0.0.1" and port > 0
    # listing by labels
    ms = provider.list_machines(cluster.name, NS)
    assert [x.name for x in ms] == [m.name] and ms[0].ip == m.ip
    assert ms[0].deployment == f"{cluster.name}-control-plane"
    assert provider.get_machine(m.name) == ms[0]
    assert provider.get_machine(f"{m.name}-nope") is None


def test_exec(provider, cluster):
    m = cluster.machine("w-1")
    r = provider.exec(m, ["sh", "-c", "echo out; echo err >&2; exit 3"], check=False)
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
    with pytest.raises(ExecError) as ei:
        provider.exec(m, ["sh", "-c", "echo boom >&2; exit 7"])
    assert ei.value.result.exit_code == 7 and "boom" in str(ei.value)
    data = os.urandom(512 * 1024)
    r = provider.exec(m, ["sha256sum"], input=data)
    import hashlib
    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    assert provider.exec(m, ["sh", "-c", "echo $FOO"], env={"FOO": "bar"}).stdout == "bar\n"
    t0 = time.monotonic()
    with pytest.raises(ExecTimeout):
        provider.exec(m, ["sleep", "30"], timeout=1)
    assert time.monotonic() - t0 < 10
    time.sleep(0.3)
    assert provider.exec(m, ["pgrep", "-x", "sleep"], check=False).exit_code == 1  # killed


def test_copy_roundtrip(provider, cluster):
    m = cluster.machine("w-1")
    data = os.urandom(300_000)
    provider.copy_to(m, "/etc/kh-test/sub/blob.bin", data, mode=0o600)
    assert provider.exec(m, ["stat", "-c", "%a %s", "/etc/kh-test/sub/blob.bin"]).stdout.split() == ["600", "300000"]
    assert provider.copy_from(m, "/etc/kh-test/sub/blob.bin") == data
    # /tmp and /run are tmpfs mounts, which the engine's archive API cannot see
    provider.copy_to(m, "/tmp/x/hello.txt", b"hello\n", mode=0o755)
    assert provider.exec(m, ["stat", "-c", "%a", "/tmp/x/hello.txt"]).stdout == "755\n"
    assert provider.exec(m, ["cat", "/tmp/x/hello.txt"]).stdout == "hello\n"
    assert provider.copy_from(m, "/tmp/x/hello.txt") == b"hello\n"
    provider.copy_to(m, "/run/kh/blob", data)
    assert provider.copy_from(m, "/run/kh/blob") == data
    assert provider.copy_from(m, "/etc/hostname").decode().strip() == m.name


def test_two_machines_reach_each_other(provider, cluster):
    a = cluster.machine("cp-1", "control-plane")
    b = cluster.machine("w-1")
    assert a.ip != b.ip
    provider.exec(a, ["ping", "-c", "1", "-W", "5", b.ip])
    provider.exec(b, ["systemd-run", "--unit", "kh-listen", "socat", "TCP-LISTEN:7777,fork,reuseaddr",
                      "SYSTEM:echo hi-from-$(hostname)"])
    out = ""
    for _ in range(50):
        out = provider.exec(a, ["bash", "-c", f"exec 3<>/dev/tcp/{b.ip}/7777 && cat <&3"], check=False).stdout
        if out:
            break
        time.sleep(0.1)
    assert out.strip() == f"hi-from-{b.name}"
    # names resolve on the cluster network (Docker embedded DNS, via the node's rewritten resolv.conf)
    assert provider.exec(a, ["getent", "hosts", b.name]).stdout.split()[0] == b.ip


def test_stop_start(provider, cluster):
    m = cluster.machine("cp-1", "control-plane")
    endpoint = provider.host_endpoint(m, 6443)
    provider.exec(m, ["sh", "-c", "echo keep > /var/lib/kh-marker && echo keep > /etc/kh-marker"])
    mid = provider.exec(m, ["cat", "/etc/machine-id"]).stdout
    provider.stop_machine(m)
    # both views agree at once: the container list (list_machines) as well as inspect
    assert {x.name: x.state for x in provider.list_machines(cluster.name, cluster.namespace)}[m.name] == "stopped"
    stopped = provider.get_machine(m.name)
    assert stopped.state == "stopped"
    assert not provider.health(stopped).running
    m2 = provider.start_machine(stopped)
    assert m2.state == "running" and provider.health(m2).booted
    assert provider.exec(m2, ["cat", "/var/lib/kh-marker", "/etc/kh-marker"]).stdout == "keep\nkeep\n"
    assert provider.exec(m2, ["cat", "/etc/machine-id"]).stdout == mid  # same machine after a restart
    assert provider.host_endpoint(m2, 6443) == endpoint  # pinned host port
    assert provider.exec(m2, ["systemctl", "is-active", "containerd"]).stdout.strip() == "active"


def test_delete_owned_removes_containers_networks_volumes(provider, image, client):
    c = Cluster(provider, image)
    provider.ensure_infrastructure(c.name, c.namespace, c.owner)
    try:
        a = c.machine("cp-1", "control-plane")
        c.machine("w-1")
        provider.ensure_load_balancer(c.name, c.namespace, c.owner, [(a.name, a.ip)])
        owned = provider.list_owned({L_CLUSTER: c.name})
        kinds = sorted((o["kind"], o["name"]) for o in owned)
        assert ("network", network_name(c.name, NS)) in kinds
        assert ("volume", volume_name(a.name)) in kinds
        assert {n for k, n in kinds if k == "machine"} == {a.name, f"{c.name}-w-1", lb_name(c.name)}
        assert all(o["labels"][L_RUN] == c.owner.run_id for o in owned)
        # the reaper's view: everything of ours carries the run label
        assert {o["name"] for o in provider.list_owned({L_RUN: c.owner.run_id})} == {o["name"] for o in owned}
        assert len(leftovers(client, c.name)) == 6
        deleted = provider.delete_owned({L_CLUSTER: c.name, L_NAMESPACE: c.namespace})
        assert f"network/{network_name(c.name, NS)}" in deleted
        assert f"volume/{volume_name(a.name)}" in deleted
    finally:
        provider.delete_owned({L_CLUSTER: c.name})
    assert leftovers(client, c.name) == []
    assert client.networks.list(names=[network_name(c.name, NS)]) == []
    assert provider.list_machines(c.name, c.namespace) == []
    assert provider.delete_owned({L_CLUSTER: c.name}) == []  # idempotent


def test_delete_machine(provider, cluster, client):
    m = cluster.machine("w-1")
    provider.delete_machine(m)
    assert provider.get_machine(m.name) is None
    assert client.volumes.list(filters={"name": volume_name(m.name)}) == []
    provider.delete_machine(m)  # already gone: no error


def test_infrastructure_is_idempotent_and_race_safe(provider, client):
    name, owner = f"t{uuid.uuid4().hex[:8]}", _owner()
    errors: list[BaseException] = []

    def go():
        try:
            DockerProvider().ensure_infrastructure(name, NS, owner)
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    try:
        threads = [threading.Thread(target=go) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        nets = client.networks.list(names=[network_name(name, NS)])
        assert len(nets) == 1
        assert nets[0].attrs["Labels"][L_CLUSTER] == name and nets[0].attrs["Driver"] == "bridge"
        provider.ensure_infrastructure(name, NS, owner)
        assert len(client.networks.list(names=[network_name(name, NS)])) == 1
    finally:
        provider.delete_infrastructure(name, NS)
    assert leftovers(client, name) == []


def _read_through(host: str, port: int, timeout: float = 20) -> str:
    end = time.monotonic() + timeout
    last = ""
    while time.monotonic() < end:
        try:
            with socket.create_connection((host, port), timeout=3) as s:
                s.settimeout(3)
                data = b""
                while True:
                    chunk = s.recv(1024)
                    if not chunk:
                        break
                    data += chunk
                if data:
                    return data.decode().strip()
        except OSError as e:
            last = str(e)
        time.sleep(0.2)
    raise AssertionError(f"nothing through the load balancer at {host}:{port}: {last}")


def test_load_balancer_forwards_and_reconfigures(provider, cluster):
    a = cluster.machine("cp-1", "control-plane")
    b = cluster.machine("cp-2", "control-plane")
    for m in (a, b):  # a stand-in API server on :6443 answering its hostname
        provider.exec(m, ["systemd-run", "--unit", "kh-fake-apiserver", "socat", "TCP-LISTEN:6443,fork,reuseaddr",
                          "SYSTEM:hostname"])
    lb = provider.ensure_load_balancer(cluster.name, cluster.namespace, cluster.owner, [(a.name, a.ip)])
    assert lb.name == lb_name(cluster.name) and lb.role == "load-balancer" and lb.state == "running"
    assert provider.health(lb).booted
    host, port = provider.host_endpoint(lb, 6443)
    assert host == "127.0.0.1"
    assert _read_through(host, port) == a.name
    lb_id = provider.client.api.inspect_container(lb.name)["Id"]

    # backends change: config rewritten, haproxy reloaded in place
    lb2 = provider.ensure_load_balancer(cluster.name, cluster.namespace, cluster.owner, [(b.name, b.ip)])
    assert provider.client.api.inspect_container(lb2.name)["Id"] == lb_id
    assert provider.host_endpoint(lb2, 6443) == (host, port)
    seen = set()
    end = time.monotonic() + 20
    while time.monotonic() < end and seen != {b.name}:
        seen = {_read_through(host, port) for _ in range(4)}
    assert seen == {b.name}

    both = [(a.name, a.ip), (b.name, b.ip)]
    provider.ensure_load_balancer(cluster.name, cluster.namespace, cluster.owner, both)
    seen = set()
    end = time.monotonic() + 20
    while time.monotonic() < end and seen != {a.name, b.name}:
        seen.add(_read_through(host, port))
    assert seen == {a.name, b.name}
    cfg = provider.copy_from(lb, "/usr/local/etc/haproxy/haproxy.cfg").decode()
    assert f"server {a.name} {a.ip}:6443" in cfg and f"server {b.name} {b.ip}:6443" in cfg
    # same backends again: nothing to do
    provider.ensure_load_balancer(cluster.name, cluster.namespace, cluster.owner, both)
    assert provider.client.api.inspect_container(lb.name)["State"]["Running"]
    # the LB is listed with the cluster's machines
    roles = {m.name: m.role for m in provider.list_machines(cluster.name, cluster.namespace)}
    assert roles[lb.name] == "load-balancer"
    assert provider.get_machine(lb.name).deployment == lb.name
    assert provider.get_machine(lb.name).labels[L_DEPLOYMENT] == lb.name


def test_collect_artifacts(provider, cluster, tmp_path):
    m = cluster.machine("w-1")
    provider.exec(m, ["sh", "-c", "mkdir -p /var/log/pods/ns_pod_uid/c && echo podlog > /var/log/pods/ns_pod_uid/c/0.log"])
    files = provider.collect_artifacts(m, str(tmp_path / m.name))
    names = {Path(f).name for f in files}
    assert {"journal.log", "kubelet.log", "containerd.log", "inspect.json", "container.log"} <= names
    d = tmp_path / m.name
    assert "containerd" in (d / "containerd.log").read_text()
    assert json.loads((d / "inspect.json").read_text())["Name"] == f"/{m.name}"
    assert (d / "pods" / "ns_pod_uid" / "c" / "0.log").read_text() == "podlog\n"
    # failure paths: a stopped machine and a missing one never raise
    provider.stop_machine(m)
    assert "inspect.json" in {Path(f).name for f in provider.collect_artifacts(m, str(tmp_path / "stopped"))}
    gone = m.replace(name=f"{m.name}-missing")
    assert provider.collect_artifacts(gone, str(tmp_path / "missing")) == []


def test_machine_options(provider, cluster, tmp_path):
    (tmp_path / "shared.txt").write_text("from the host\n")
    m = cluster.machine("w-1", extra_mounts=[{"hostPath": str(tmp_path), "containerPath": "/mnt/host",
                                              "readOnly": True}],
                        extra_ports=[{"container_port": 8080}], env={"KH_TEST": "1"})
    assert provider.exec(m, ["cat", "/mnt/host/shared.txt"]).stdout == "from the host\n"
    assert provider.exec(m, ["touch", "/mnt/host/x"], check=False).exit_code != 0
    host, port = provider.host_endpoint(m, 8080)
    assert host == "127.0.0.1" and port > 0
    assert provider.exec(m, ["sh", "-c", "tr '\\0' '\\n' < /proc/1/environ | grep KH_TEST"]).stdout == "KH_TEST=1\n"


def test_shared_network(provider, cluster, client):
    """Option ``networks``: the node joins a network outside its cluster (made if missing,
    reachable under the machine's name), which outlives the cluster's infrastructure."""
    shared = f"kh-shared-{uuid.uuid4().hex[:6]}"
    try:
        m = cluster.machine("w-1", networks=[shared])
        nets = client.api.inspect_container(m.name)["NetworkSettings"]["Networks"]
        assert set(nets) == {network_name(cluster.name, NS), shared}
        assert m.ip == nets[network_name(cluster.name, NS)]["IPAddress"]  # its own network comes first
        peer = client.containers.run(image=cluster.image, entrypoint=["getent", "hosts", m.name], network=shared,
                                     remove=True)
        assert peer.split()[0].decode() == nets[shared]["IPAddress"]
        provider.delete_machine(m)
        provider.delete_infrastructure(cluster.name, NS)
        assert client.networks.list(names=[shared])  # not the cluster's: stays
    finally:
        for n in client.networks.list(names=[shared]):
            n.remove()


def test_unprivileged_fallback_boots(provider, cluster, client):
    """privileged: false, the documented fallback for engines that cannot run
    privileged containers: every capability, no --privileged, still boots."""
    m = cluster.machine("w-1", privileged=False)
    assert client.api.inspect_container(m.name)["HostConfig"]["Privileged"] is False
    assert provider.exec(m, ["systemctl", "is-active", "containerd"]).stdout.strip() == "active"


def test_node_image_hook(provider, image):
    """A prebuilt image must exist locally (nothing is pulled); the node image of a
    version is built (the kubeadm suite boots it); no version: the base image."""
    from harness.build.cache import BuildError
    assert provider.node_image("v1.37.2", image=image) == image
    assert provider.node_image_problem(image) is None
    with pytest.raises(BuildError, match="node image 'example/node:v1.37.2' not found locally"):
        provider.node_image("v1.37.2", image="example/node:v1.37.2")
    assert "docker images" in provider.node_image_problem("example/node:v1.37.2")
    assert provider.node_image(None) == image  # machines only: the base image


@pytest.mark.skipif(os.path.exists("/sys/fs/cgroup/cgroup.controllers"), reason="cgroup v1 host only")
def test_cgroup_v1_fixups_without_cgroupns(provider, cluster):
    """cgroupns=host on a cgroup v1 host: the entrypoint's kind-style fix-ups
    (unscoped hierarchies unmounted, host cgroup path bind-mounted, /kubelet
    cgroup roots) let systemd and containerd run all the same."""
    m = cluster.machine("w-1", cgroupns="host")
    assert "applying cgroup v1 fix-ups" in provider.logs(m)
    r = provider.exec(m, ["sh", "-c", "systemctl is-system-running; systemctl is-active containerd; "
                                      "p=$(cut -d: -f3 /proc/1/cgroup | grep -m1 docker | sed 's#/init.scope##'); "
                                      "test -d /sys/fs/cgroup/memory$p && echo host-path-ok; "
                                      "test -d /sys/fs/cgroup/memory/kubelet && test -d /sys/fs/cgroup/cpuset/kubelet.slice "
                                      "&& test -d /sys/fs/cgroup/systemd/kubelet.slice && echo kubelet-roots-ok"],
                      check=False)
    lines = r.stdout.split()
    assert lines[:2] == ["running", "active"], r
    assert "host-path-ok" in lines and "kubelet-roots-ok" in lines, r


def test_dual_stack_network(provider, image, client):
    """A cluster whose IP families include IPv6 gets an IPv6 subnet on its
    network; its machines have an address of each family (IPv4 first) and
    forward IPv6; an IPv4-only network is refused for such a cluster."""
    c = Cluster(provider, image)
    provider.ensure_infrastructure(c.name, c.namespace, c.owner, (4, 6))
    try:
        net = client.networks.get(network_name(c.name, c.namespace))
        assert net.attrs["EnableIPv6"] is True
        m = c.machine("w-1", wait=False)
        v4, v6 = m.address(4), m.address(6)
        assert v4 and ":" not in v4 and m.ip == v4
        assert v6 and v6 in m.addresses
        r = provider.exec(m, ["cat", "/proc/sys/net/ipv6/conf/all/forwarding",
                              "/proc/sys/net/ipv6/conf/all/disable_ipv6"])
        assert r.stdout.split() == ["1", "0"]
    finally:
        provider.delete_owned({L_CLUSTER: c.name, L_NAMESPACE: c.namespace})
    assert leftovers(client, c.name) == []
    v4_only = Cluster(provider, image)
    provider.ensure_infrastructure(v4_only.name, v4_only.namespace, v4_only.owner)
    try:
        with pytest.raises(Exception, match="without IPv6"):
            provider.ensure_infrastructure(v4_only.name, v4_only.namespace, v4_only.owner, (4, 6))
    finally:
        provider.delete_owned({L_CLUSTER: v4_only.name, L_NAMESPACE: v4_only.namespace})


@pytest.mark.skipif(not FREEZER.is_dir(), reason="no cgroup v1 freezer on this host (cgroup v2)")
def test_removes_a_container_a_frozen_cgroup_keeps_alive(provider, image, client):
    """A process of the container in a FROZEN cgroup v1 freezer group (as a runc killed
    inside a node leaves a pod's cgroup) cannot die, so the engine refuses to remove it
    ("did not receive an exit event"); the provider thaws the group and removes it."""
    name = f"kh-test-frozen-{uuid.uuid4().hex[:6]}"
    c = client.containers.run(image, entrypoint=["sleep", "600"], detach=True, name=name)
    try:
        c.exec_run(["sh", "-c", "sleep 600 &"], detach=True)
        time.sleep(1)
        c.reload()
        top = client.api.top(c.id)
        col = top["Titles"].index("PID")
        child = next(int(p[col]) for p in top["Processes"] if int(p[col]) != c.attrs["State"]["Pid"])
        own = next(ln.split(":", 2)[2] for ln in Path(f"/proc/{c.attrs['State']['Pid']}/cgroup").read_text()
                   .splitlines() if ln.split(":", 2)[1] == "freezer")
        group = FREEZER / own.lstrip("/") / "kh-frozen"
        group.mkdir()
        (group / "tasks").write_text(str(child))
        (group / "freezer.state").write_text("FROZEN")
        with pytest.raises(docker.errors.APIError, match="did not receive an exit event"):
            client.api.remove_container(c.id, force=True)
        assert provider.cleanup.remove_container(c.id, name) == [f"machine/{name}"]
        assert client.containers.list(all=True, filters={"name": name}) == []
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            thaw(c.attrs["State"]["Pid"])
            c.remove(force=True, v=True)
