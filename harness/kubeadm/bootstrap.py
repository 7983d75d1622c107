"""kubeadm bootstrapper: turns booted node machines into a cluster.

Implements the controller's ``Bootstrapper`` protocol (``image``, ``init``,
``join``, ``ready``, ``remove``) the way kind and kinder drive kubeadm:

* ``init``: for more than one control plane, the provider's API load
  balancer in front of all control-plane machines; the generated config
  (:mod:`harness.kubeadm.config`) on the first control plane; ``kubeadm
  init --upload-certs``; admin.conf copied to ``cluster.kubeconfig_path``
  with the server rewritten to the host endpoint; the CNI (:mod:`.cni`).
* ``join``: control planes one at a time (etcd grows one member at a time;
  kubeadm's join of a stacked-etcd member is not safe concurrently), with
  the certificate key of the uploaded certs; workers in parallel threads.
* ``ready``: CNI routes synced, every node Ready, every control plane's
  static pods (etcd, apiserver, controller-manager, scheduler) Ready,
  kube-proxy on every node, CoreDNS Ready.
* ``remove``: drain, ``kubeadm reset`` on control planes (leaves etcd),
  delete the Node.

Preflight runs, ignoring only the checks that fail in any node container
and, on a cgroup v1 host, SystemVerification (:mod:`.preflight`).

Bootstrap values (token, certificate key, endpoint, CA hash) are kept in
``<cluster.state_dir>/kubeadm.json`` so another process (an xdist worker, a
later ``--reuse-cluster`` run) can join machines too; when that file is
missing they are recovered from the cluster.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import os
import shlex
import threading
import time
from pathlib import Path
from typing import Any, Iterable

import yaml

from harness.cluster import Cluster, write_private
from harness.progress import phase
from providers.base import (ExecResult, HostLimits, LoadBalancer, Machine, MissingCapability, NodeImages,
                            require)

from . import cni, preflight
from . import config as kconfig
from .validate import check_kubeadm_patches

log = logging.getLogger("harness.kubeadm")

REMOTE_DIR = "/etc/kube-harness"
LOG_DIR = "/var/log/kube-harness"
INIT_CONFIG = f"{REMOTE_DIR}/kubeadm-init.yaml"
JOIN_CONFIG = f"{REMOTE_DIR}/kubeadm-join.yaml"
ADMIN_CONF = "/etc/kubernetes/admin.conf"
#: uploaded certs are deleted by kubeadm after 2h; re-upload when older than this
CERTS_MAX_AGE = 3600
TOKEN_TTL = "24h0m0s"
OUTPUT_TAIL = 60


class KubeadmError(RuntimeError):
    """A kubeadm step failed; the message has the output's tail."""

    def __init__(self, message: str, output: str = ""):
        self.output = output
        super().__init__(message)


def _tail(text: str, n: int = OUTPUT_TAIL) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


class KubeadmBootstrapper:
    """Bootstraps clusters with kubeadm; see the module docs."""

    name = "kubeadm"

    def __init__(self, node_image: str | None = None, *, verbosity: int | None = None,
                 init_timeout: float = 600, join_timeout: float = 600, ready_timeout: float = 300,
                 join_parallelism: int = 4):
        self.node_image = node_image or None
        self.verbosity = int(os.environ.get("KUBE_HARNESS_KUBEADM_V", "1") if verbosity is None else verbosity)
        self.init_timeout = init_timeout
        self.join_timeout = join_timeout
        self.ready_timeout = ready_timeout
        self.join_parallelism = join_parallelism
        self._images: dict[str, str] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ image
    def image(self, cluster: Cluster) -> str:
        """The node image (:meth:`_image`), after the spec's kubeadm patches
        passed the real kubeadm of its version (when this host has it)."""
        image = self._image(cluster)
        check_kubeadm_patches(cluster.spec)
        return image

    def _image(self, cluster: Cluster) -> str:
        """The node image: ``node_image`` (--node-image), else the provider's
        ``node_image`` for the spec's version and options (the Docker provider
        checks ``provider.options.image`` exists, or builds a node image with the
        test images preloaded); a provider without node images needs the option."""
        if self.node_image:
            return self.node_image
        opts = dict(cluster.spec.provider_options or {})
        version = cluster.spec.version
        if not isinstance(cluster.provider, NodeImages):
            if opts.get("image"):
                return str(opts["image"])
            raise MissingCapability(cluster.provider, NodeImages, f"a node image for Kubernetes {version}; set "
                                    f"spec.provider.options.image or --node-image")
        if opts.get("image"):
            return cluster.provider.node_image(version, **opts)
        with self._lock:
            if version not in self._images:
                self._images[version] = cluster.provider.node_image(version, **opts)
            return self._images[version]

    # ------------------------------------------------------------- init
    def init(self, cluster: Cluster, machine: Machine) -> None:
        spec, p = cluster.spec, cluster.provider
        if isinstance(p, HostLimits):
            p.check_host_limits(cluster.name)
        with phase("kubeadm-config", cluster=cluster.name, machine=machine.name):
            lb = None
            if spec.control_plane.replicas > 1:
                with phase("load-balancer", cluster=cluster.name):
                    lb = self._update_lb(cluster, cluster.control_planes)
            endpoint_machine = lb or machine
            host, hport = p.host_endpoint(endpoint_machine, kconfig.API_PORT)
            sans = [s for s in (endpoint_machine.name, endpoint_machine.ip, host) if s]
            cgroup_root = self._cgroup_root(cluster, machine)
            cgroup_v1 = self._cgroup_v1(cluster, machine)
            params = kconfig.Params(
                control_plane_endpoint=f"{endpoint_machine.name}:{kconfig.API_PORT}",
                token=kconfig.new_token(), certificate_key=kconfig.new_certificate_key(),
                cert_sans=tuple(sans), cgroup_root=cgroup_root, cgroup_v1=cgroup_v1)
            text = kconfig.init_config(spec, params, self._node(cluster, machine))
            p.copy_to(machine, INIT_CONFIG, text.encode(), mode=0o600)
            log.debug(f"kubeadm init config:\n{_redact(text)}", extra={"cluster": cluster.name,
                                                                          "machine": machine.name})
            cni.install(cluster, machine)
        with phase("kubeadm-init", cluster=cluster.name, machine=machine.name):
            self._kubeadm(cluster, machine, ["init", f"--config={INIT_CONFIG}", "--upload-certs",
                                             "--skip-token-print", *preflight.args(cgroup_v1),
                                             f"--v={self.verbosity}"],
                          "init", self.init_timeout)
        ca = p.copy_from(machine, "/etc/kubernetes/pki/ca.crt")
        state = {"controlPlaneEndpoint": params.control_plane_endpoint, "token": params.token,
                 "certificateKey": params.certificate_key, "certsUploaded": time.time(),
                 "caCertHashes": [kconfig.ca_cert_hash(ca)], "certSANs": list(params.cert_sans),
                 "cgroupRoot": cgroup_root, "cgroupV1": cgroup_v1, "initMachine": machine.name,
                 "loadBalancer": lb.name if lb else None}
        self._save_state(cluster, state)
        with phase("kubeconfig", cluster=cluster.name):
            self._write_kubeconfig(cluster, machine, (host, hport))
        with phase("cni", cluster=cluster.name, machine=machine.name):
            self._wait_pod_cidrs(cluster, [machine.name], timeout=120)
            cni.sync_routes(cluster, [machine])

    def _node(self, cluster: Cluster, m: Machine) -> kconfig.Node:
        md = cluster.deployments.get(m.deployment)
        labels = dict(md.labels) if md else {}
        ips = tuple(m.address(f) for f in cluster.spec.ip_families)
        if not all(ips):
            raise KubeadmError(f"machine {m.name} has addresses {list(m.addresses)}, none of IP family "
                               f"IPv{cluster.spec.ip_families[ips.index('')]}, which spec.clusterNetwork.ipFamily "
                               f"{cluster.spec.ip_family} needs (the provider's network must have it)")
        return kconfig.Node(name=m.name, ip=ips[0], control_plane=m.role == "control-plane", labels=labels,
                            provider_id=f"kube-harness://{cluster.provider.name}/{cluster.namespace}/{m.name}",
                            ips=ips)

    def _cgroup_root(self, cluster: Cluster, m: Machine) -> str | None:
        """``/kubelet`` when the node runs in the host's cgroup namespace on
        cgroup v1 and its entrypoint prepared a kubelet.slice in every
        hierarchy (kind's fix-ups); otherwise None: with a private cgroup
        namespace the node's root cgroup is already its own."""
        script = (
            "set -e; [ ! -f /sys/fs/cgroup/cgroup.controllers ]; "
            # private cgroup namespace: the cpu controller path is "/"
            "p=$(grep -E '^[^:]*:([^:]*,)?cpu(,[^:]*)?:' /proc/self/cgroup | head -n1 | cut -d: -f3); "
            "[ \"$p\" != / ]; "
            "for h in $(findmnt -rn -o TARGET -t cgroup); do [ -d \"$h/kubelet.slice\" ]; done")
        r = cluster.provider.exec(m, ["bash", "-c", script], check=False, timeout=30)
        return "/kubelet" if r.ok else None

    def _cgroup_v1(self, cluster: Cluster, m: Machine) -> bool:
        v1 = preflight.cgroup_v1(cluster, m)
        if v1:
            preflight.warn_cgroup_v1(cluster.name)
        return v1

    def _write_kubeconfig(self, cluster: Cluster, cp: Machine, hostport: tuple[str, int]) -> None:
        raw = cluster.provider.copy_from(cp, ADMIN_CONF)
        kc = yaml.safe_load(raw)
        host, port = hostport
        h = f"[{host}]" if ":" in host else host
        for c in kc.get("clusters") or []:
            c["cluster"]["server"] = f"https://{h}:{port}"
        cluster.set_kubeconfig(yaml.safe_dump(kc, sort_keys=False))  # old clients pointed elsewhere
        log.info(f"kubeconfig {cluster.kubeconfig_path} -> https://{h}:{port}",
                 extra={"cluster": cluster.name, "phase": "kubeconfig"})

    # ------------------------------------------------------------- join
    def join(self, cluster: Cluster, machines: list[Machine]) -> None:
        if not machines:
            return
        params = self._params(cluster)
        cps = sorted((m for m in machines if m.role == "control-plane"), key=lambda m: m.name)
        workers = sorted((m for m in machines if m.role != "control-plane"), key=lambda m: m.name)
        joined: list[Machine] = []
        if cps:
            params = self._ensure_certs(cluster, params, exclude={m.name for m in machines})
            for m in cps:  # one etcd member at a time
                self._join_one(cluster, m, params)
                joined.append(m)
                if self._state(cluster).get("loadBalancer"):
                    members = [c for c in cluster.control_planes if c.name not in {x.name for x in cps}
                               or c.name in {x.name for x in joined}]
                    self._update_lb(cluster, members)
        if workers:
            n = max(1, min(self.join_parallelism, len(workers)))
            with cf.ThreadPoolExecutor(max_workers=n, thread_name_prefix="kubeadm-join") as ex:
                futs = {ex.submit(self._join_one, cluster, m, params): m for m in workers}
                errors = []
                for f in cf.as_completed(futs):
                    try:
                        f.result()
                        joined.append(futs[f])
                    except BaseException as e:
                        errors.append(e)
            if errors:
                if len(errors) > 1:
                    log.error(f"{len(errors)} worker joins failed", extra={"cluster": cluster.name})
                raise errors[0]
        with phase("cni", cluster=cluster.name):
            self._wait_pod_cidrs(cluster, [m.name for m in joined], timeout=120)
            cni.sync_routes(cluster)

    def _join_one(self, cluster: Cluster, m: Machine, params: kconfig.Params) -> None:
        role = "control-plane" if m.role == "control-plane" else "worker"
        with phase(f"kubeadm-join-{role}", cluster=cluster.name, machine=m.name):
            text = kconfig.join_config(cluster.spec, params, self._node(cluster, m))
            cluster.provider.copy_to(m, JOIN_CONFIG, text.encode(), mode=0o600)
            cni.install(cluster, m)
            self._kubeadm(cluster, m, ["join", f"--config={JOIN_CONFIG}", *preflight.args(params.cgroup_v1),
                                       f"--v={self.verbosity}"], "join", self.join_timeout)

    def _params(self, cluster: Cluster) -> kconfig.Params:
        """Join parameters: from the state file, repaired from the cluster
        where needed (a token that expired or was deleted is re-created)."""
        st = self._state(cluster)
        if not st.get("controlPlaneEndpoint"):
            st = self._recover_state(cluster)
        if not self._token_exists(cluster, st["token"]):
            cp = self._existing_control_plane(cluster)
            with phase("kubeadm-token", cluster=cluster.name, machine=cp.name):
                self._kubeadm(cluster, cp, ["token", "create", st["token"], f"--ttl={TOKEN_TTL}",
                                            "--description=kube-harness join token"], "token", 120, stream=False)
        return kconfig.Params(control_plane_endpoint=st["controlPlaneEndpoint"], token=st["token"],
                              certificate_key=st.get("certificateKey") or kconfig.new_certificate_key(),
                              cert_sans=tuple(st.get("certSANs") or ()),
                              ca_cert_hashes=tuple(st.get("caCertHashes") or ()),
                              cgroup_root=st.get("cgroupRoot"), cgroup_v1=bool(st.get("cgroupV1")))

    def _ensure_certs(self, cluster: Cluster, params: kconfig.Params, exclude: set[str]) -> kconfig.Params:
        """Re-upload the control-plane certs (kubeadm deletes them after 2h)."""
        st = self._state(cluster)
        if st.get("certificateKey") == params.certificate_key and \
                time.time() - float(st.get("certsUploaded") or 0) < CERTS_MAX_AGE:
            return params
        cp = self._existing_control_plane(cluster, exclude)
        with phase("kubeadm-upload-certs", cluster=cluster.name, machine=cp.name):
            self._kubeadm(cluster, cp, ["init", "phase", "upload-certs", "--upload-certs",
                                        f"--certificate-key={params.certificate_key}"], "upload-certs", 180,
                          stream=False)
        st.update(certificateKey=params.certificate_key, certsUploaded=time.time())
        self._save_state(cluster, st)
        return params

    def _existing_control_plane(self, cluster: Cluster, exclude: Iterable[str] = ()) -> Machine:
        """A running control plane that is already part of the cluster."""
        ex = set(exclude)
        st = self._state(cluster)
        cands = [m for m in cluster.control_planes if m.state == "running" and m.name not in ex]
        cands.sort(key=lambda m: (m.name != st.get("initMachine"), m.name))
        for m in cands:
            r = cluster.provider.exec(m, ["test", "-f", ADMIN_CONF], check=False, timeout=30)
            if r.ok:
                return m
        raise KubeadmError(f"cluster {cluster.namespace}/{cluster.name}: no running control plane with "
                           f"{ADMIN_CONF} (candidates: {[m.name for m in cands]})")

    def _token_exists(self, cluster: Cluster, token: str) -> bool:
        from kubernetes.client.exceptions import ApiException
        tid = token.split(".")[0]
        try:
            cluster.core.read_namespaced_secret(f"bootstrap-token-{tid}", "kube-system")
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    def _recover_state(self, cluster: Cluster) -> dict[str, Any]:
        """Rebuild the state file from a running cluster (no local state)."""
        cp = self._existing_control_plane(cluster)
        if not cluster.kubeconfig_path.exists():
            lb = cluster.load_balancer()
            self._write_kubeconfig(cluster, cp, cluster.provider.host_endpoint(lb or cp, kconfig.API_PORT))
        cm = cluster.core.read_namespaced_config_map("kubeadm-config", "kube-system")
        cc = yaml.safe_load(cm.data["ClusterConfiguration"])
        kc = cluster.core.read_namespaced_config_map("kubelet-config", "kube-system")
        kcfg = yaml.safe_load(kc.data["kubelet"])
        lb = cluster.load_balancer()
        st = {"controlPlaneEndpoint": cc["controlPlaneEndpoint"], "token": kconfig.new_token(),
              "certificateKey": kconfig.new_certificate_key(), "certsUploaded": 0,
              "caCertHashes": [kconfig.ca_cert_hash(cluster.provider.copy_from(cp, "/etc/kubernetes/pki/ca.crt"))],
              "certSANs": list((cc.get("apiServer") or {}).get("certSANs") or []),
              "cgroupRoot": kcfg.get("cgroupRoot"), "cgroupV1": kcfg.get("failCgroupV1") is False,
              "initMachine": cp.name,
              "loadBalancer": lb.name if lb else None}
        self._save_state(cluster, st)
        return st

    # state file
    def _state_path(self, cluster: Cluster) -> Path:
        return Path(cluster.state_dir) / "kubeadm.json"

    def _state(self, cluster: Cluster) -> dict[str, Any]:
        try:
            return json.loads(self._state_path(cluster).read_text())
        except (OSError, ValueError):
            return {}

    def _save_state(self, cluster: Cluster, st: dict[str, Any]) -> None:
        write_private(self._state_path(cluster), json.dumps(st, indent=2))

    def _update_lb(self, cluster: Cluster, control_planes: Iterable[Machine]) -> Machine:
        backends = [(m.name, m.ip) for m in sorted(control_planes, key=lambda m: m.name)]
        require(cluster.provider, LoadBalancer, needed_for="the API load balancer of several control planes")
        return cluster.provider.ensure_load_balancer(cluster.name, cluster.namespace, cluster.owner, backends,
                                                     kconfig.API_PORT)

    # ------------------------------------------------------------ ready
    def ready(self, cluster: Cluster) -> None:
        expected = {m.name for m in cluster.machines() if m.role in ("control-plane", "worker")}
        control_planes = {m.name for m in cluster.control_planes}
        with phase("cni", cluster=cluster.name):
            self._wait_pod_cidrs(cluster, sorted(expected), timeout=120)
            cni.sync_routes(cluster)
        with phase("nodes-ready", cluster=cluster.name):
            self._wait_nodes_ready(cluster, expected, self.ready_timeout)
        with phase("system-pods", cluster=cluster.name):
            self._wait_system_pods(cluster, expected, control_planes, self.ready_timeout)

    def wait_system_pods(self, cluster: Cluster) -> None:
        """kube-proxy on every machine, every control plane's static pods and CoreDNS Ready
        (for clusters another controller bootstrapped with kubeadm)."""
        machines = {m.name for m in cluster.machines() if m.role in ("control-plane", "worker")}
        with phase("system-pods", cluster=cluster.name):
            self._wait_system_pods(cluster, machines, {m.name for m in cluster.control_planes}, self.ready_timeout)

    def _wait_pod_cidrs(self, cluster: Cluster, names: list[str], timeout: float) -> None:
        end = time.monotonic() + timeout
        missing: list[str] = list(names)
        last = ""
        while time.monotonic() < end:
            try:
                have = {n.metadata.name: n.spec.pod_cidr for n in cluster.core.list_node().items}
                missing = [n for n in names if not have.get(n)]
                if not missing:
                    return
            except Exception as e:  # apiserver (re)starting
                last = f"{type(e).__name__}: {str(e)[:200]}"
            time.sleep(1)
        raise KubeadmError(f"cluster {cluster.namespace}/{cluster.name}: nodes without spec.podCIDR after "
                           f"{timeout:.0f}s: {missing} (node not registered, or kube-controller-manager not "
                           f"allocating node CIDRs){'; last error: ' + last if last else ''}")

    def _wait_nodes_ready(self, cluster: Cluster, expected: set[str], timeout: float) -> None:
        from harness.waits import node_ready
        end = time.monotonic() + timeout
        state: dict[str, str] = {n: "not registered" for n in expected}
        next_sync = time.monotonic() + 30
        while True:
            try:
                nodes = {n.metadata.name: n for n in cluster.core.list_node().items}
                state = {}
                for name in expected:
                    n = nodes.get(name)
                    if n is None:
                        state[name] = "not registered"
                    elif not node_ready(n):
                        c = next((c for c in (n.status.conditions or []) if c.type == "Ready"), None)
                        state[name] = f"{c.reason}: {c.message}" if c else "no Ready condition"
                if not state:
                    return
            except Exception as e:
                state = {"(api)": f"{type(e).__name__}: {str(e)[:200]}"}
            if time.monotonic() > end:
                break
            if time.monotonic() > next_sync:  # a node that restarted meanwhile
                next_sync = time.monotonic() + 30
                try:
                    cni.sync_routes(cluster)
                except Exception as e:
                    log.debug(f"cni sync while waiting: {e}")
            time.sleep(2)
        raise KubeadmError(f"cluster {cluster.namespace}/{cluster.name}: nodes not Ready after {timeout:.0f}s:\n"
                           + "\n".join(f"  {k}: {v}" for k, v in sorted(state.items()))
                           + self._kubelet_tails(cluster, [k for k in state if k != "(api)"]))

    def _wait_system_pods(self, cluster: Cluster, expected: set[str], control_planes: set[str],
                          timeout: float) -> None:
        end = time.monotonic() + timeout
        problems: list[str] = []
        while True:
            problems = []
            try:
                static = {p.metadata.name: p for p in cluster.core.list_namespaced_pod(
                    "kube-system", label_selector="tier=control-plane").items}
                for cp in sorted(control_planes):
                    for c in CONTROL_PLANE_COMPONENTS:
                        pod = static.get(f"{c}-{cp}")
                        if pod is None or not _pod_ready(pod):
                            problems.append(f"{c} on {cp}: {_pod_state(pod) if pod else 'no mirror pod'}")
                dns = cluster.core.list_namespaced_pod("kube-system", label_selector="k8s-app=kube-dns").items
                if not dns:
                    problems.append("no CoreDNS pods (k8s-app=kube-dns)")
                for pod in dns:
                    if not _pod_ready(pod):
                        problems.append(f"CoreDNS {pod.metadata.name} on {pod.spec.node_name or '-'}: "
                                        f"{_pod_state(pod)}")
                proxies = cluster.core.list_namespaced_pod("kube-system", label_selector="k8s-app=kube-proxy").items
                on = {p.spec.node_name for p in proxies if _pod_ready(p)}
                for n in sorted(expected - on):
                    problems.append(f"kube-proxy not Running on {n}")
            except Exception as e:
                problems.append(f"{type(e).__name__}: {str(e)[:200]}")
            if not problems:
                return
            if time.monotonic() > end:
                break
            time.sleep(2)
        raise KubeadmError(f"cluster {cluster.namespace}/{cluster.name}: system pods not ready after "
                           f"{timeout:.0f}s:\n" + "\n".join(f"  {p}" for p in problems))

    def _kubelet_tails(self, cluster: Cluster, names: list[str], lines: int = 25) -> str:
        out = []
        for name in names[:4]:
            try:
                m = cluster.machine(name)
                r = cluster.provider.exec(m, ["journalctl", "-u", "kubelet", "--no-pager", "-o", "cat",
                                              "-n", str(lines)], check=False, timeout=30)
                out.append(f"\n--- kubelet journal of {name} (last {lines} lines) ---\n{r.stdout.rstrip()}")
            except Exception as e:
                out.append(f"\n--- kubelet journal of {name}: unavailable ({e}) ---")
        return "".join(out)

    # ----------------------------------------------------------- remove
    def remove(self, cluster: Cluster, machine: Machine) -> None:
        """Take a machine out of the cluster before it is deleted: drain,
        ``kubeadm reset`` (control planes: leaves etcd), etcd member removal
        when reset could not do it (the machine is dead), load balancer
        without it, Node deleted. Each step runs even if an earlier one
        failed; the first error is raised at the end."""
        current = cluster.provider.get_machine(machine.name) or machine
        alive = current.state == "running"
        others = [c for c in cluster.control_planes if c.name != machine.name and c.state == "running"]
        run_on = others[0] if others else machine
        errors: list[BaseException] = []
        extra = {"cluster": cluster.name, "machine": machine.name}
        if alive:
            with phase("drain", cluster=cluster.name, machine=machine.name):
                try:
                    r = cluster.kubectl("drain", machine.name, "--ignore-daemonsets", "--delete-emptydir-data",
                                        "--force", "--grace-period=10", "--timeout=120s", machine=run_on,
                                        check=False, timeout=180)
                    if not r.ok and "not found" not in (r.stderr + r.stdout):
                        log.warning(f"drain {machine.name} failed: {_tail(r.stderr or r.stdout, 5)}", extra=extra)
                except Exception as e:
                    log.warning(f"drain {machine.name} failed: {e}", extra=extra)
        else:
            log.info(f"{machine.name} is {current.state}: not draining", extra=extra)
        if machine.role == "control-plane":
            if alive:
                with phase("kubeadm-reset", cluster=cluster.name, machine=machine.name):
                    try:
                        r = cluster.provider.exec(machine, ["kubeadm", "reset", "-f", f"--v={self.verbosity}"],
                                                  check=False, timeout=300)
                        if not r.ok:
                            log.warning(f"kubeadm reset on {machine.name} failed ({r.exit_code}): "
                                        f"{_tail(r.stderr or r.stdout, 10)}", extra=extra)
                    except Exception as e:
                        log.warning(f"kubeadm reset on {machine.name} failed: {e}", extra=extra)
            if others:
                try:
                    advertised = machine.address(cluster.spec.ip_families[0])
                    self._remove_etcd_member(cluster, others[0], machine.name, advertised)
                except Exception as e:
                    errors.append(e)
            if self._state(cluster).get("loadBalancer") and others:
                try:
                    self._update_lb(cluster, others)
                except Exception as e:
                    errors.append(e)
        with phase("delete-node", cluster=cluster.name, machine=machine.name):
            from kubernetes.client.exceptions import ApiException
            try:
                cluster.core.delete_node(machine.name)
            except ApiException as e:
                if e.status != 404:
                    errors.append(e)
            except Exception as e:
                errors.append(e)
        rest = [m for m in cluster.machines() if m.name != machine.name]
        try:
            cni.sync_routes(cluster, rest)
        except Exception as e:
            log.warning(f"cni sync after removing {machine.name}: {e}", extra={"cluster": cluster.name})
        if errors:
            raise errors[0]

    def _remove_etcd_member(self, cluster: Cluster, via: Machine, name: str, ip: str = "") -> None:
        """``etcdctl member remove`` for a member kubeadm reset did not remove
        (the machine was dead). Uses the etcd static pod on ``via``."""
        # the local API server, not the load balancer (which may still send
        # some connections to the member being removed)
        base = ["--server=https://127.0.0.1:6443", "--request-timeout=30s", "-n", "kube-system", "exec",
                f"etcd-{via.name}", "--", "etcdctl",
                f"--endpoints={kconfig.etcd_local_endpoint(cluster.spec)}", "--cacert=/etc/kubernetes/pki/etcd/ca.crt",
                "--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt",
                "--key=/etc/kubernetes/pki/etcd/healthcheck-client.key"]
        for attempt in range(6):
            r = cluster.kubectl(*base, "member", "list", machine=via, check=False, timeout=60)
            if r.ok:
                break
            time.sleep(5)
        if not r.ok:
            raise KubeadmError(f"etcd member list via {via.name} failed: {_tail(r.stderr or r.stdout, 5)}")
        for line in r.stdout.splitlines():
            f = [x.strip() for x in line.split(",")]
            # ID, status, name, peer URLs, client URLs, learner; a member that never started has no name
            if len(f) >= 4 and (f[2] == name or (not f[2] and ip and (f"//{ip}:" in f[3] or f"//[{ip}]:" in f[3]))):
                log.info(f"removing etcd member {f[0]} ({name})", extra={"cluster": cluster.name,
                                                                         "phase": "etcd-member-remove"})
                rr = cluster.kubectl(*base, "member", "remove", f[0], machine=via, check=False, timeout=60)
                if not rr.ok:
                    raise KubeadmError(f"etcd member remove {f[0]} ({name}) failed: {_tail(rr.stderr, 5)}")

    # --------------------------------------------------------- kubeadm
    def _kubeadm(self, cluster: Cluster, m: Machine, args: list[str], what: str, timeout: float,
                 stream: bool = True) -> str:
        """Run kubeadm on a machine; its output goes to the log line by line
        while it runs. Raises KubeadmError with the output's tail."""
        cmd = ["kubeadm", *args]
        if not stream:
            r = cluster.provider.exec(m, cmd, check=False, timeout=timeout)
            out = r.stdout + r.stderr
            if not r.ok:
                raise KubeadmError(f"{m.name}: kubeadm {what} failed (exit {r.exit_code}):\n{_tail(out)}", out)
            return out
        out, rc = self._stream(cluster, m, cmd, f"kubeadm-{what}", timeout)
        if rc != 0:
            tail = _tail(out)
            extra = self._kubelet_tails(cluster, [m.name], 20) if what in ("init", "join") else ""
            raise KubeadmError(f"{m.name}: kubeadm {what} failed ({'timed out' if rc is None else f'exit {rc}'})"
                               f"; last lines of its output:\n{tail}{extra}", out)
        return out

    def _stream(self, cluster: Cluster, m: Machine, cmd: list[str], name: str,
                timeout: float) -> tuple[str, int | None]:
        """Start ``cmd`` detached on the machine with its output in a file,
        and follow the file. Returns (output, exit code or None on timeout)."""
        p = cluster.provider
        logf, rcf, pidf = f"{LOG_DIR}/{name}.log", f"{LOG_DIR}/{name}.rc", f"{LOG_DIR}/{name}.pid"
        inner = f"{shlex.join(cmd)} >{logf} 2>&1; echo $? >{rcf}.tmp; mv {rcf}.tmp {rcf}"
        start = (f"mkdir -p {LOG_DIR} && rm -f {rcf} && : >{logf} && "
                 f"(setsid bash -c {shlex.quote(inner)} </dev/null >/dev/null 2>&1 & echo $! >{pidf})")
        p.exec(m, ["bash", "-c", start], timeout=60)
        extra = {"cluster": cluster.name, "machine": m.name, "phase": name}
        offset, buf, chunks = 0, "", []
        end = time.monotonic() + timeout
        rc: int | None = None
        while True:
            r: ExecResult = p.exec(m, ["bash", "-c", f"cat {rcf} 2>/dev/null; echo; echo '--kh--'; "
                                                     f"tail -c +{offset + 1} {logf}"], check=False, timeout=60)
            head, _, data = r.stdout.partition("--kh--\n")
            if data:
                offset += len(data.encode())
                chunks.append(data)
                buf += data
                *lines, buf = buf.split("\n")
                for line in lines:
                    self._log_line(line, extra)
            code = head.strip()
            if code:
                rc = int(code) if code.lstrip("-").isdigit() else 1
                # the last output was written before the rc file
                r = p.exec(m, ["tail", "-c", f"+{offset + 1}", logf], check=False, timeout=60)
                if r.stdout:
                    chunks.append(r.stdout)
                    buf += r.stdout
                for line in buf.split("\n"):
                    if line:
                        self._log_line(line, extra)
                break
            if time.monotonic() > end:
                p.exec(m, ["bash", "-c", f"kill -TERM -- -$(cat {pidf}) 2>/dev/null || kill $(cat {pidf})"],
                       check=False, timeout=30)
                chunks.append(f"\n(kube-harness: killed after {timeout:.0f}s)\n")
                break
            time.sleep(1)
        return "".join(chunks), rc

    @staticmethod
    def _log_line(line: str, extra: dict) -> None:
        line = line.rstrip()
        if not line:
            return
        # kubeadm's "[phase] ..." lines are its progress; klog lines (--v) go to the JSON log only
        if line.startswith("[") or line.startswith("Your Kubernetes") or line.startswith("This node has joined"):
            log.info(f"kubeadm: {line}", extra=extra)
        else:
            log.debug(f"kubeadm: {line}", extra=extra)


def _redact(text: str) -> str:
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith(("token:", "- token:", "certificateKey:")):
            line = line.split(":", 1)[0] + ": <redacted>"
        out.append(line)
    return "\n".join(out)


CONTROL_PLANE_COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


def _pod_ready(pod) -> bool:
    if (pod.status.phase or "") != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def _pod_state(pod) -> str:
    st = pod.status.phase or "?"
    for cs in pod.status.container_statuses or []:
        w = cs.state.waiting if cs.state else None
        if w:
            st += f" ({cs.name}: {w.reason}: {(w.message or '')[:120]})"
    for c in pod.status.conditions or []:
        if c.status != "True" and c.message:
            st += f" [{c.type}: {c.message[:120]}]"
    return st


__all__ = ["KubeadmBootstrapper", "KubeadmError"]
