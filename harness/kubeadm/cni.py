"""A minimal CNI for harness clusters, modelled on kindnet.

Every node gets a ``spec.podCIDR`` (a /24 of the cluster's pod network)
from kube-controller-manager (``allocate-node-cidrs``). Then, per node:

* ``/etc/cni/net.d/10-kube-harness.conflist``: the reference ``ptp`` plugin
  (a veth pair per pod, /32 host route; no bridge, so hairpin traffic
  through a Service works without hairpin mode) with ``host-local`` IPAM
  over that node's podCIDR (state on /run, so a restarted node starts with
  a clean allocation) and ``portmap`` for hostPort. Loopback needs no
  entry: containerd's CRI sets up ``lo`` itself with ``/opt/cni/bin/loopback``.
* a route to every *other* node's podCIDR via that node's InternalIP
  (``ip route replace <cidr> via <ip>``, as kindnet does); routes to pod
  CIDRs of nodes that are gone are deleted. All nodes share one L2 network
  (the provider's bridge), so no encapsulation is needed.
* masquerade of pod traffic leaving the pod network (to node addresses and
  beyond), so replies find their way back through the node; pod-to-pod
  traffic keeps its source address (chain ``KH-CNI-MASQ`` in ``nat``).

All of this is one idempotent shell script (:data:`SYNC_SCRIPT`, from ``cni_files/``) that takes
the node table (``name podCIDR internalIP`` lines) on stdin. The harness
runs it on every machine through :func:`sync_routes` (from the bootstrapper's
``init``/``join``/``ready``, i.e. after provisioning, scale-up and repair),
and a small systemd unit on each node (``kh-cni.service``) runs it every
few seconds with the node table from ``kubectl`` (as ServiceAccount
``kube-system/kube-harness-cni``, which may list Nodes: the node authorizer
lets a kubelet read only its own Node), so routes come back after a node container restart (which
loses its routing table) without the harness being involved.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # pragma: no cover
    from harness.cluster import Cluster
    from providers.base import Machine

log = logging.getLogger("harness.kubeadm.cni")

NETWORK_NAME = "kube-harness"
CONFLIST_PATH = "/etc/cni/net.d/10-kube-harness.conflist"
SYNC_PATH = "/usr/local/bin/kh-cni-sync"
AGENT_PATH = "/usr/local/bin/kh-cni-agent"
ENV_PATH = "/etc/kube-harness/cni.env"
TOKEN_PATH = "/etc/kube-harness/cni.token"
SERVICE_ACCOUNT = "kube-harness-cni"
TOKEN_SECRET = "kube-harness-cni-token"
CLUSTER_ROLE = "kube-harness:cni"
UNIT_NAME = "kh-cni.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
IPAM_DIR = "/run/cni-ipam-state"
MASQ_CHAIN = "KH-CNI-MASQ"
SVC_CHAIN = "KH-CNI-SVC"
AGENT_INTERVAL = 10


@dataclass(frozen=True)
class NodeNet:
    name: str
    pod_cidr: str  # the Node's podCIDRs, comma-separated; "" until kube-controller-manager assigned them
    ip: str  # its InternalIPs, comma-separated

    def line(self) -> str:
        return f"{self.name} {self.pod_cidr or '-'} {self.ip or '-'}"


def _family(address_or_cidr: str) -> int:
    return 6 if ":" in address_or_cidr else 4


def conflist(pod_cidrs: str, mtu: int = 1500) -> dict:
    """The CNI network configuration list for a node's podCIDRs (comma-separated, one per family)."""
    cidrs = pod_cidrs.split(",")
    return {
        "cniVersion": "0.4.0",
        "name": NETWORK_NAME,
        "plugins": [
            {
                "type": "ptp",
                "ipMasq": False,  # KH-CNI-MASQ does it, sparing pod-to-pod traffic
                "mtu": mtu,
                "ipam": {
                    "type": "host-local",
                    "dataDir": IPAM_DIR,
                    "ranges": [[{"subnet": c}] for c in cidrs],
                    "routes": [{"dst": "::/0" if _family(c) == 6 else "0.0.0.0/0"} for c in cidrs],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def node_table(nodes: Iterable[NodeNet]) -> str:
    return "".join(n.line() + "\n" for n in sorted(nodes, key=lambda n: n.name))


def desired_routes(self_name: str, nodes: Iterable[NodeNet]) -> list[tuple[str, str]]:
    """``(podCIDR, via)`` for every other node's podCIDR that it has an address of the same family for."""
    out = []
    for n in nodes:
        if n.name == self_name or not n.pod_cidr or not n.ip:
            continue
        for cidr in n.pod_cidr.split(","):
            via = next((a for a in n.ip.split(",") if _family(a) == _family(cidr)), "")
            if via:
                out.append((cidr, via))
    return sorted(out)


FILES = Path(__file__).with_name("cni_files")


def _file(name: str, **values: object) -> str:
    """A data file of :data:`FILES` with its ``@KEY@`` placeholders filled in."""
    text = (FILES / name).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", str(value))
    return text


# The node-side sync. Arguments: NODE_NAME CLUSTER_POD_CIDRS [SERVICE_CIDRS]
# (comma-separated, one per IP family); stdin: the node table. Prints what it
# changed. Exit 0 unless a command failed. Its conflist body is the same as
# conflist() (tests compare them).
SYNC_SCRIPT = _file("kh-cni-sync.sh", CONFLIST=CONFLIST_PATH, IPAM=IPAM_DIR, CHAIN=MASQ_CHAIN,
                    SVC_CHAIN=SVC_CHAIN, NETWORK=NETWORK_NAME)
# Node-local agent: the same sync every AGENT_INTERVAL seconds, with the node
# table from the API.
AGENT_SCRIPT = _file("kh-cni-agent.sh", ENV=ENV_PATH, SYNC=SYNC_PATH, TOKEN=TOKEN_PATH, INTERVAL=AGENT_INTERVAL)
UNIT = _file("kh-cni.service", INTERVAL=AGENT_INTERVAL, AGENT=AGENT_PATH)


#: identifies what install() puts on a machine; a machine with another one is reinstalled
INSTALL_VERSION = __import__("hashlib").sha256((SYNC_SCRIPT + AGENT_SCRIPT + UNIT).encode()).hexdigest()[:12]
VERSION_PATH = "/etc/kube-harness/cni.version"


def env_file(node_name: str, cluster_pod_cidr: str, service_cidr: str = "") -> str:
    out = f"NODE_NAME={shlex.quote(node_name)}\nCLUSTER_POD_CIDR={shlex.quote(cluster_pod_cidr)}\n"
    return out + (f"SERVICE_CIDR={shlex.quote(service_cidr)}\n" if service_cidr else "")


# ----------------------------------------------------------------- cluster
def node_networks(cluster: "Cluster") -> list[NodeNet]:
    out = []
    for n in cluster.core.list_node().items:
        ips = ",".join(a.address for a in (n.status.addresses or []) if a.type == "InternalIP")
        cidrs = ",".join(n.spec.pod_cidrs or ([n.spec.pod_cidr] if n.spec.pod_cidr else []))
        out.append(NodeNet(n.metadata.name, cidrs, ips))
    return out


def install(cluster: "Cluster", machine: "Machine") -> None:
    """Put the sync script, the agent and its unit on a machine (idempotent;
    the agent starts once the kubelet has credentials)."""
    p = cluster.provider
    p.copy_to(machine, SYNC_PATH, SYNC_SCRIPT.encode(), mode=0o755)
    p.copy_to(machine, AGENT_PATH, AGENT_SCRIPT.encode(), mode=0o755)
    p.copy_to(machine, ENV_PATH, env_file(machine.name, cluster.spec.pod_cidr, cluster.spec.service_cidr).encode())
    p.copy_to(machine, UNIT_PATH, UNIT.encode())
    p.exec(machine, ["bash", "-c", f"systemctl daemon-reload && systemctl enable {UNIT_NAME} >/dev/null 2>&1; "
                                   f"systemctl restart {UNIT_NAME}"], timeout=60)
    p.copy_to(machine, VERSION_PATH, INSTALL_VERSION.encode())


def ensure_credentials(cluster: "Cluster", timeout: float = 60) -> str:
    """The node agent's API token: ServiceAccount ``kube-system/kube-harness-cni``
    allowed to get/list/watch Nodes, with a long-lived token Secret."""
    import time

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    def create(fn, *args) -> None:
        try:
            fn(*args)
        except ApiException as e:
            if e.status != 409:
                raise

    core, rbac = cluster.core, client.RbacAuthorizationV1Api(cluster.api_client())
    labels = {"app.kubernetes.io/managed-by": "kube-harness"}
    create(core.create_namespaced_service_account, "kube-system", client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name=SERVICE_ACCOUNT, labels=labels)))
    create(rbac.create_cluster_role, client.V1ClusterRole(
        metadata=client.V1ObjectMeta(name=CLUSTER_ROLE, labels=labels),
        rules=[client.V1PolicyRule(api_groups=[""], resources=["nodes"], verbs=["get", "list", "watch"])]))
    create(rbac.create_cluster_role_binding, client.V1ClusterRoleBinding(
        metadata=client.V1ObjectMeta(name=CLUSTER_ROLE, labels=labels),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=CLUSTER_ROLE),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name=SERVICE_ACCOUNT, namespace="kube-system")]))
    create(core.create_namespaced_secret, "kube-system", client.V1Secret(
        metadata=client.V1ObjectMeta(name=TOKEN_SECRET, labels=labels,
                                     annotations={"kubernetes.io/service-account.name": SERVICE_ACCOUNT}),
        type="kubernetes.io/service-account-token"))
    end = time.monotonic() + timeout
    while True:
        sec = core.read_namespaced_secret(TOKEN_SECRET, "kube-system")
        if (sec.data or {}).get("token"):
            import base64
            return base64.b64decode(sec.data["token"]).decode()
        if time.monotonic() > end:
            raise TimeoutError(f"secret kube-system/{TOKEN_SECRET} has no token after {timeout:.0f}s "
                               f"(kube-controller-manager's token controller not running?)")
        time.sleep(0.5)


def sync_machine(cluster: "Cluster", machine: "Machine", nodes: Iterable[NodeNet], token: str = "") -> str:
    if token:
        cluster.provider.copy_to(machine, TOKEN_PATH, token.encode(), mode=0o600)
    r = cluster.provider.exec(machine, ["bash", "-c", f'[ "$(cat {VERSION_PATH} 2>/dev/null)" = {INSTALL_VERSION} ] '
                                                      f'|| exit 127; exec {SYNC_PATH} "$0" "$1" "$2"',
                                        machine.name, cluster.spec.pod_cidr, cluster.spec.service_cidr],
                              input=node_table(nodes).encode(), check=False, timeout=60)
    if r.exit_code == 127:
        install(cluster, machine)
        r = cluster.provider.exec(machine, [SYNC_PATH, machine.name, cluster.spec.pod_cidr,
                                            cluster.spec.service_cidr],
                                  input=node_table(nodes).encode(), check=True, timeout=60)
    elif not r.ok:
        from providers.base import ExecError
        raise ExecError(machine.name, [SYNC_PATH, machine.name], r)
    return r.stdout.strip()


def sync_routes(cluster: "Cluster", machines: Iterable["Machine"] | None = None) -> dict[str, list[tuple[str, str]]]:
    """Bring the CNI config, pod routes and masquerade rules of every running
    node machine in line with the Node objects. Idempotent; safe to call
    after scale-up, repair or a node restart. Returns ``{machine: routes}``
    (the routes each machine should now have)."""
    nodes = node_networks(cluster)
    token = ensure_credentials(cluster)
    ms = [m for m in (machines if machines is not None else cluster.machines())
          if m.role in ("control-plane", "worker") and m.state == "running"]

    def one(m: "Machine") -> tuple[str, list[tuple[str, str]]]:
        changed = sync_machine(cluster, m, nodes, token)
        if changed:
            log.info(f"cni: {'; '.join(changed.splitlines())}", extra={"cluster": cluster.name, "machine": m.name,
                                                                        "phase": "cni"})
        return m.name, desired_routes(m.name, nodes)

    if not ms:
        return {}
    with cf.ThreadPoolExecutor(max_workers=min(4, len(ms))) as ex:
        return dict(ex.map(one, ms))


def conflist_json(pod_cidr: str, mtu: int = 1500) -> str:
    return json.dumps(conflist(pod_cidr, mtu), indent=2)
