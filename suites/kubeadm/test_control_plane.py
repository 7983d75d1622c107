"""Control-plane machines as kubeadm leaves them (kubernetes
test/e2e_kubeadm: controlplane_nodes_test.go, kubeadm_certs_test.go; kinder
ci: static pods and certificates)."""
from __future__ import annotations

import re

import pytest

from harness.kubeadm.config import etcd_local_endpoint


pytestmark = [pytest.mark.cluster]

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
CERTS = ("admin.conf", "apiserver", "apiserver-etcd-client", "apiserver-kubelet-client", "controller-manager.conf",
         "etcd-healthcheck-client", "etcd-peer", "etcd-server", "front-proxy-client", "scheduler.conf")
CAS = ("ca", "etcd-ca", "front-proxy-ca")


def test_static_pod_manifests(cluster):
    for m in cluster.control_planes:
        files = set(cluster.exec(m, ["ls", "/etc/kubernetes/manifests"]).stdout.split())
        assert {f"{c}.yaml" for c in COMPONENTS} <= files, f"{m.name}: {sorted(files)}"
    for m in cluster.workers:
        files = cluster.exec(m, ["ls", "/etc/kubernetes/manifests"]).stdout.split()
        assert files == [], f"{m.name} has static pods: {files}"


def test_mirror_pods_running(cluster):
    pods = {p.metadata.name: p for p in cluster.core.list_namespaced_pod("kube-system").items}
    for m in cluster.control_planes:
        for c in COMPONENTS:
            p = pods.get(f"{c}-{m.name}")
            assert p is not None, f"no mirror pod {c}-{m.name}"
            assert "kubernetes.io/config.mirror" in (p.metadata.annotations or {})
            assert p.spec.node_name == m.name
            assert p.status.phase == "Running", f"{p.metadata.name}: {p.status.phase}"
            ready = {c.type: (c.status, c.message) for c in p.status.conditions or []}
            restarts = {s.name: s.restart_count for s in p.status.container_statuses or []}
            assert ready.get("Ready", ("",))[0] == "True", f"{p.metadata.name} not Ready: {ready}, restarts {restarts}"


def _residual_days(s: str) -> float:
    m = re.fullmatch(r"(?:(\d+)y)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?", s)
    assert m and s, f"unparsed residual time {s!r}"
    y, d, h, mi = (int(x) if x else 0 for x in m.groups())
    return y * 365 + d + h / 24 + mi / 1440


_EXPIRY_LINE = re.compile(r"^(\S+)\s+\w{3} \d{2}, \d{4} \d{2}:\d{2} UTC\s+(\S+)\s")


def check_expiration(cluster, machine) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """``kubeadm certs check-expiration``: residual days of the certificates
    and of the CAs, and the names kubeadm reports !MISSING!."""
    out = cluster.exec(machine, ["kubeadm", "certs", "check-expiration"]).stdout
    certs: dict[str, float] = {}
    cas: dict[str, float] = {}
    missing: list[str] = []
    section = None
    for line in out.splitlines():
        if line.startswith("CERTIFICATE AUTHORITY"):
            section = cas
        elif line.startswith("CERTIFICATE"):
            section = certs
        elif line.startswith("!MISSING!"):
            missing.append(line.split()[1])
        elif section is not None and (m := _EXPIRY_LINE.match(line)):
            section[m.group(1)] = _residual_days(m.group(2))
    return certs, cas, missing


def test_certificates(cluster):
    for m in cluster.control_planes:
        certs, cas, reported_missing = check_expiration(cluster, m)
        missing = [c for c in CERTS if c not in certs]
        assert not missing, f"{m.name}: certificates missing: {missing} (have {sorted(certs)}, " \
                            f"kubeadm: !MISSING! {reported_missing})"
        # super-admin.conf exists only where kubeadm init ran
        assert set(reported_missing) <= {"super-admin.conf"}, f"{m.name}: !MISSING! {reported_missing}"
        for name, days in certs.items():
            assert days > 300, f"{m.name}: {name} expires in {days:.0f} days"
        assert set(CAS) <= set(cas), f"{m.name}: CAs {sorted(cas)}"
        for name, days in cas.items():
            assert 9 * 365 <= days <= 10 * 365 + 3, f"{m.name}: CA {name} residual {days:.0f} days"


def test_control_planes_share_the_ca(cluster):
    cas = {m.name: cluster.exec(m, ["sha256sum", "/etc/kubernetes/pki/ca.crt"]).stdout.split()[0]
           for m in cluster.machines()}
    assert len(set(cas.values())) == 1, cas


def test_etcd_members(cluster):
    """One stacked etcd member per control plane."""
    cp = cluster.control_planes[0]
    r = cluster.kubectl("-n", "kube-system", "exec", f"etcd-{cp.name}", "--", "etcdctl",
                        f"--endpoints={etcd_local_endpoint(cluster.spec)}", "--cacert=/etc/kubernetes/pki/etcd/ca.crt",
                        "--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt",
                        "--key=/etc/kubernetes/pki/etcd/healthcheck-client.key", "member", "list", check=False)
    if not r.ok and ("executable file not found" in r.stderr or "no such file" in r.stderr.lower()):
        pytest.skip(f"the etcd image has no etcdctl: {r.stderr.strip()[:200]}")
    assert r.ok, r.stderr
    names = sorted(line.split(",")[2].strip() for line in r.stdout.splitlines() if line.strip())
    assert names == sorted(m.name for m in cluster.control_planes)


def test_api_ready_through_kubeconfig(cluster):
    """/readyz answers "ok" where the host kubeconfig points."""
    api = cluster.api_client()
    r = api.rest_client.pool_manager.request("GET", f"{api.configuration.host}/readyz", timeout=10)
    assert r.status == 200 and r.data == b"ok", (r.status, r.data[:200])


@pytest.mark.direct_mode
def test_kubeconfig_points_at_published_port(cluster):
    """The host kubeconfig points at the published API port of the load balancer
    when there is one, else of the control plane."""
    lb = cluster.load_balancer()
    target = lb or cluster.control_planes[0]
    host, port = cluster.provider.host_endpoint(target, 6443)
    assert cluster.api_client().configuration.host.rstrip("/") == f"https://{host}:{port}"
