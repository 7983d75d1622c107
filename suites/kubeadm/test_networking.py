"""Pod networking and DNS on every node: a busybox HTTP server DaemonSet
(one pod per node, control planes included) behind a ClusterIP Service; from
each node's pod the Service resolves by its DNS name and answers, and every
other pod answers on its pod IP (cross-node pod traffic through the CNI
routes). On IPv6 and dual-stack clusters this holds for every IP family:
pods and the Service have an address of each, and each is reached."""
from __future__ import annotations

import time

import pytest
from kubernetes import client

pytestmark = [pytest.mark.cluster]

APP = "kh-echo"
PORT = 8080
# busybox 1.35's wget crashes with -T: bound it with timeout(1) instead
WGET = "timeout 5 wget -q -O -"


def _daemonset(image: str) -> client.V1DaemonSet:
    labels = {"app": APP}
    # the page is the pod's name: answers say which pod served them
    cmd = f"hostname >/var/www/index.html && exec httpd -f -v -p {PORT} -h /var/www"
    return client.V1DaemonSet(
        metadata=client.V1ObjectMeta(name=APP, labels=labels),
        spec=client.V1DaemonSetSpec(
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    tolerations=[client.V1Toleration(operator="Exists")],  # control planes too
                    termination_grace_period_seconds=1,
                    containers=[client.V1Container(
                        name="httpd", image=image, image_pull_policy="Never", command=["sh", "-c", cmd],
                        ports=[client.V1ContainerPort(container_port=PORT)],
                        readiness_probe=client.V1Probe(
                            tcp_socket=client.V1TCPSocketAction(port=PORT), period_seconds=1))]))))


@pytest.fixture(scope="module")
def echo(cluster, namespace, busybox, nodes):
    cluster.apps.create_namespaced_daemon_set(namespace, _daemonset(busybox))
    cluster.core.create_namespaced_service(namespace, client.V1Service(
        metadata=client.V1ObjectMeta(name=APP),
        spec=client.V1ServiceSpec(selector={"app": APP}, ip_family_policy="PreferDualStack",
                                  ports=[client.V1ServicePort(port=80, target_port=PORT)])))
    want = {n.metadata.name for n in nodes}
    end = time.monotonic() + 180
    pods: list = []
    while time.monotonic() < end:
        pods = cluster.core.list_namespaced_pod(namespace, label_selector=f"app={APP}").items
        ready = [p for p in pods if p.status.pod_ip and any(
            c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
        if {p.spec.node_name for p in ready} == want and len(ready) == len(want):
            pods = ready
            break
        time.sleep(2)
    else:
        state = {p.metadata.name: (p.spec.node_name, p.status.phase,
                                   [(cs.state.waiting.reason if cs.state and cs.state.waiting else "")
                                    for cs in p.status.container_statuses or []]) for p in pods}
        pytest.fail(f"{APP} pods not ready on every node {sorted(want)} after 180s: {state}")
    eps_end = time.monotonic() + 60
    while time.monotonic() < eps_end:  # endpoints follow readiness
        ep = cluster.core.read_namespaced_endpoints(APP, namespace)
        if sum(len(s.addresses or []) for s in ep.subsets or []) == len(pods):
            break
        time.sleep(1)
    return {p.spec.node_name: p for p in pods}


def _url(ip: str, port: int) -> str:
    return f"http://[{ip}]:{port}/" if ":" in ip else f"http://{ip}:{port}/"


def _pod_ips(pod) -> list[str]:
    return [a.ip for a in pod.status.pod_ips or []] or [pod.status.pod_ip]


def _in_pod(cluster, namespace, pod, script: str, timeout: float = 60):
    return cluster.kubectl("-n", namespace, "exec", pod.metadata.name, "--", "sh", "-c", script,
                           check=False, timeout=timeout)


def test_pod_on_every_node(cluster, echo, nodes):
    """A pod on every node, with an address of each IP family from that node's podCIDR of the family."""
    import ipaddress
    assert set(echo) == {n.metadata.name for n in nodes}
    cidrs = {n.metadata.name: n.spec.pod_cidrs or [n.spec.pod_cidr] for n in nodes}
    for node, pod in echo.items():
        ips = _pod_ips(pod)
        assert [ipaddress.ip_address(ip).version for ip in ips] == list(cluster.spec.ip_families), (node, ips)
        for ip, cidr in zip(ips, cidrs[node]):
            assert ipaddress.ip_address(ip) in ipaddress.ip_network(cidr), (node, ip, cidr)


def test_service_by_dns_name_from_every_node(cluster, namespace, echo):
    fqdn = f"{APP}.{namespace}.svc.{cluster.spec.service_domain}"
    svc_ip = cluster.core.read_namespaced_service(APP, namespace).spec.cluster_ip
    pod_names = {p.metadata.name for p in echo.values()}
    failures = {}
    for node, pod in sorted(echo.items()):
        r = _in_pod(cluster, namespace, pod, f"nslookup {fqdn}; echo ---; "
                    f"for i in 1 2 3 4 5 6; do {WGET} http://{fqdn}/ || echo FAIL; done")
        dns, _, http = r.stdout.partition("---")
        answers = http.split()
        if svc_ip not in dns:
            failures[node] = f"{fqdn} did not resolve to {svc_ip}: {dns.strip()} {r.stderr.strip()}"
        elif "FAIL" in answers or not answers or not set(answers) <= pod_names:
            failures[node] = f"http://{fqdn}/ answers {answers} {r.stderr.strip()}"
    assert not failures, failures


def test_pod_to_pod_across_nodes(cluster, namespace, echo):
    """Every pod reaches every pod on each of its addresses (every IP family)."""
    targets = {ip: p.metadata.name for p in echo.values() for ip in _pod_ips(p)}
    failures = {}
    for node, pod in sorted(echo.items()):
        script = "; ".join(f"echo {ip}=$({WGET} {_url(ip, PORT)} || echo FAIL)" for ip in targets)
        r = _in_pod(cluster, namespace, pod, script)
        got = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
        bad = {ip: got.get(ip) for ip, name in targets.items() if got.get(ip) != name}
        if bad:
            failures[f"{node} ({pod.status.pod_ip})"] = bad
    assert not failures, f"pod-to-pod failures (source -> {{target: answer}}): {failures}"


def test_service_ip_of_every_family(cluster, namespace, echo):
    """The Service has a ClusterIP of each IP family, and each answers from every node's pod."""
    import ipaddress
    ips = cluster.core.read_namespaced_service(APP, namespace).spec.cluster_ips
    assert [ipaddress.ip_address(ip).version for ip in ips] == list(cluster.spec.ip_families), ips
    pod_names = {p.metadata.name for p in echo.values()}
    failures = {}
    for node, pod in sorted(echo.items()):
        script = "; ".join(f"echo {ip}=$({WGET} {_url(ip, 80)} || echo FAIL)" for ip in ips)
        r = _in_pod(cluster, namespace, pod, script)
        got = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
        bad = {ip: got.get(ip) for ip in ips if got.get(ip) not in pod_names}
        if bad:
            failures[node] = bad
    assert not failures, f"Service IP failures (source node -> {{ClusterIP: answer}}): {failures}"


def test_kubernetes_api_from_pods(cluster, namespace, echo):
    """The kubernetes Service (kube-proxy DNAT to the API servers) from every node's pod."""
    failures = {}
    for node, pod in sorted(echo.items()):
        # busybox's TLS cannot talk to Go 1.26 servers (handshake failure): plain HTTP to the
        # TLS port gets the Go TLS server's own answer, which only the API server can give
        r = _in_pod(cluster, namespace, pod, "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | timeout 5 nc "
                    f"kubernetes.default.svc.{cluster.spec.service_domain} 443")
        if "Client sent an HTTP request to an HTTPS server" not in r.stdout:
            failures[node] = (r.stdout + r.stderr).strip()
    assert not failures, failures


def test_unserved_service_port_is_refused(cluster, namespace, echo):
    """A Service IP on a port no Service has is refused on the node (the
    CNI's KH-CNI-SVC chain), never sent to the host's network, which may
    answer it (conformance: Services ... same port and different protocols)."""
    svc = cluster.core.read_namespaced_service(APP, namespace).spec.cluster_ip
    failures = {}
    for node, pod in sorted(echo.items()):
        r = _in_pod(cluster, namespace, pod, f"{WGET} {_url(svc, 81)} && echo ANSWERED; "
                                             f"{WGET} {_url(svc, 80)} >/dev/null && echo SERVED")
        if "ANSWERED" in r.stdout or "SERVED" not in r.stdout:
            failures[node] = (r.stdout + r.stderr).strip()
    assert not failures, f"port 81 must be refused, port 80 served: {failures}"
