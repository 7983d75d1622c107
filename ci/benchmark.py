#!/usr/bin/env python3
"""Benchmark: the harness and kind side by side, phase by phase.

  python3 ci/benchmark.py                      # 1 and 3 nodes, 3 rounds each, harness vs kind
  python3 ci/benchmark.py --nodes 1 --rounds 5
  python3 ci/benchmark.py --no-kind --suite    # the harness only, and suites/kubeadm on it
  python3 ci/benchmark.py --uncached-build     # also a cold build (slow)
  python3 ci/benchmark.py --growth             # the harness at 1, 3, 5, 10 nodes and 1, 2, 3 clusters at once

Both make the same topology (1 control plane + N-1 workers) from the same node
image (the harness's, which meets kind's node-image contract), alternately on
the same host, with kind built from the Go module proxy. Each round is timed
from the create call until every Node is Ready and CoreDNS is ready (its
readiness probe: the kube-dns endpoints are ready); the phases are the
harness's own timings and, for kind, the moments its "✓ <step>" lines appear.
Prints the median of every phase per tool and the ratio harness/kind, and
writes every round to $ARTIFACTS/benchmark.json.

``--growth`` measures how the harness scales: clusters of 1, 3, 5 and 10
nodes, then 1, 2 and 3 clusters of ``--growth-cluster-nodes`` made at once
(as xdist workers with --cluster-scope worker do). For each: wall time to
CoreDNS ready, host CPU seconds spent meanwhile, and the node containers'
memory once ready, in all and per node.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kubernetes import client, config as kconfig  # noqa: E402

from harness.controller import MachineController  # noqa: E402
from harness.kubeadm.bootstrap import KubeadmBootstrapper  # noqa: E402
from harness.progress import artifacts_dir, configure  # noqa: E402
from harness.reaper import current_owner  # noqa: E402
from harness.spec import load, parse  # noqa: E402
from providers import registry  # noqa: E402

#: kind's "✓ <step>" lines -> the phase names this benchmark uses
KIND_STEPS = {"Ensuring node image": "image", "Preparing nodes": "machines", "Writing configuration": "config",
              "Starting control-plane": "init", "Installing CNI": "cni", "Installing StorageClass": "storage",
              "Joining worker nodes": "join"}
PHASES = ("machines", "init", "join", "ready", "create to CoreDNS ready", "delete")


def timed(fn, *a, **kw):
    t0 = time.monotonic()
    out = fn(*a, **kw)
    return out, round(time.monotonic() - t0, 1)


def build_times(version: str, uncached: bool) -> dict[str, float]:
    from harness.build import kube
    res: dict[str, float] = {}
    if uncached:
        env = {**os.environ, "KUBE_HARNESS_CACHE": f"/tmp/kh-bench-cache-{uuid.uuid4().hex[:6]}",
               "GOCACHE": f"/tmp/kh-bench-gocache-{uuid.uuid4().hex[:6]}"}
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "harness.build", "--version", version], env=env, check=True, cwd=ROOT)
        res["build kubernetes (uncached, cold Go cache)"] = round(time.monotonic() - t0, 1)
    _, res["build kubernetes (cached)"] = timed(kube.build_kubernetes, version)
    _, res["node image (cached)"] = timed(node_image, version)
    return res


def node_image(version: str) -> str:
    """The harness's node image, as its direct mode uses it (the suites' images preloaded)."""
    from harness.build.nodeimage import build_node_image
    from harness.build.testimages import test_images
    return build_node_image(version, extra_images=test_images())


def wait_coredns(kubeconfig: Path, nodes: int, timeout: float = 300) -> None:
    """Until ``nodes`` Nodes are Ready and CoreDNS is (kube-dns endpoints ready)."""
    api = kconfig.new_client_from_config(str(kubeconfig))
    core, disc = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            try:
                ready = [n for n in core.list_node().items
                         if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])]
                slices = disc.list_namespaced_endpoint_slice("kube-system",
                                                             label_selector="kubernetes.io/service-name=kube-dns")
                dns = [e for s in slices.items for e in s.endpoints or [] if e.conditions and e.conditions.ready]
                if len(ready) == nodes and dns:
                    return
            except Exception:  # the API server is still coming up
                pass
            time.sleep(0.2)
    finally:
        api.close()
    raise TimeoutError(f"{kubeconfig}: {nodes} Ready nodes and CoreDNS not seen within {timeout}s")


def spec_for(base: Path, nodes: int, name: str):
    doc = load(base).to_dict()
    doc["metadata"]["name"] = name
    doc["spec"]["topology"]["controlPlane"]["replicas"] = 1
    if nodes > 1:
        doc["spec"]["topology"]["workers"] = {"machineDeployments": [{"name": "md-0", "replicas": nodes - 1}]}
    else:
        doc["spec"]["topology"].pop("workers", None)
    return parse(doc, "benchmark")


def harness_round(base: Path, nodes: int, image: str, suite: bool) -> dict[str, float]:
    spec = spec_for(base, nodes, f"bench{nodes}-{uuid.uuid4().hex[:4]}")
    ctl = MachineController(registry.get(spec.provider, spec.provider_options), current_owner("bench"),
                            KubeadmBootstrapper(node_image=image))
    t0 = time.monotonic()
    cluster = ctl.provision(spec)
    out: dict[str, float] = {}
    try:
        wait_coredns(cluster.kubeconfig_path, nodes)
        out["create to CoreDNS ready"] = round(time.monotonic() - t0, 1)
        t = cluster.timings
        out["machines"] = t.get("machines", 0)
        out["init"] = next((v for k, v in t.items() if k.startswith("init")), 0)
        out["join"] = t.get("join", 0)
        out["ready"] = t.get("ready", 0)
        if suite:
            cfg = Path(tempfile.gettempdir()) / f"kh-bench-{spec.name}.yaml"
            cfg.write_text(json.dumps(spec.to_dict()))
            t1 = time.monotonic()
            r = subprocess.run([sys.executable, "-m", "pytest", "suites/kubeadm", "-q", "-p", "no:cacheprovider",
                                "--reuse-cluster", "--cluster-config", str(cfg)], cwd=ROOT)
            out["suites/kubeadm"] = round(time.monotonic() - t1, 1)
            out["suites/kubeadm exit"] = r.returncode
    finally:
        _, out["delete"] = timed(ctl.teardown, cluster)
    return out


def cpu_seconds() -> float:
    """Host CPU time so far (user + system + iowait-free work of every CPU)."""
    import psutil
    t = psutil.cpu_times()
    return t.user + t.system + getattr(t, "nice", 0) + getattr(t, "irq", 0) + getattr(t, "softirq", 0)


def containers_memory(cluster) -> float:
    """MiB the cluster's node containers use (cgroup memory usage, page cache excluded)."""
    import docker
    total = 0.0
    with docker.from_env() as d:
        for m in cluster.machines():
            st = d.containers.get(m.name).stats(stream=False).get("memory_stats") or {}
            cache = (st.get("stats") or {}).get("total_inactive_file", (st.get("stats") or {}).get("inactive_file", 0))
            total += (st.get("usage", 0) - cache) / 2**20
    return round(total, 1)


def growth_round(base: Path, nodes: int, image: str, clusters: int = 1) -> dict[str, float]:
    """``clusters`` harness clusters of ``nodes`` nodes made at once: wall time, CPU, memory."""
    specs = [spec_for(base, nodes, f"grow{nodes}-{i}-{uuid.uuid4().hex[:4]}") for i in range(clusters)]
    ctl = MachineController(registry.get(specs[0].provider, specs[0].provider_options), current_owner("bench"),
                            KubeadmBootstrapper(node_image=image))
    made: list = []

    def one(spec):
        cluster = ctl.provision(spec)
        made.append(cluster)
        wait_coredns(cluster.kubeconfig_path, nodes)
        return cluster

    cpu0, t0 = cpu_seconds(), time.monotonic()
    try:
        with cf.ThreadPoolExecutor(max_workers=clusters) as ex:
            list(ex.map(one, specs))
        wall, cpu = round(time.monotonic() - t0, 1), round(cpu_seconds() - cpu0, 1)
        mem = sum(containers_memory(c) for c in made)
    finally:
        for c in made:
            ctl.teardown(c)
    total_nodes = nodes * clusters
    return {"nodes": total_nodes, "clusters": clusters, "wall": wall, "cpu seconds": cpu,
            "cpu seconds per node": round(cpu / total_nodes, 1), "memory MiB": round(mem, 1),
            "memory MiB per node": round(mem / total_nodes, 1)}


def growth(base: Path, image: str, per_cluster: int) -> list[dict[str, float]]:
    rows = []
    for n in (1, 3, 5, 10):
        rows.append({"what": f"1 cluster of {n} node(s)", **growth_round(base, n, image)})
        print(rows[-1], flush=True)
    for k in (2, 3):
        rows.append({"what": f"{k} clusters of {per_cluster} node(s) at once",
                     **growth_round(base, per_cluster, image, clusters=k)})
        print(rows[-1], flush=True)
    return rows


def kind_round(kind: Path, nodes: int, image: str) -> dict[str, float]:
    from harness.build.kind import write_cluster_config
    name = f"bench{nodes}-{uuid.uuid4().hex[:4]}"
    tmp = Path(tempfile.mkdtemp(prefix="kh-bench-kind-"))
    cfg = write_cluster_config(tmp / "kind.yaml", workers=nodes - 1)
    kubeconfig = tmp / "kubeconfig"
    t0 = time.monotonic()
    p = subprocess.Popen([str(kind), "create", "cluster", "--name", name, "--image", image, "--config", str(cfg),
                          "--kubeconfig", str(kubeconfig), "--retain"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    marks: dict[str, float] = {}
    log = []
    for line in p.stdout:  # kind prints "✓ <step>" as each step ends
        log.append(line)
        m = re.search(r"✓ (.+?)\s*\S*$", line.strip())
        step = next((v for k, v in KIND_STEPS.items() if m and m.group(1).startswith(k)), None)
        if step:
            marks[step] = time.monotonic() - t0
    out: dict[str, float] = {}
    try:
        if p.wait() != 0:
            raise RuntimeError(f"kind create cluster failed:\n{''.join(log)[-3000:]}")
        created = time.monotonic() - t0
        wait_coredns(kubeconfig, nodes)
        out["create to CoreDNS ready"] = round(time.monotonic() - t0, 1)
        start = marks.get("image", 0)
        out["machines"] = round(marks.get("machines", start) - start, 1)
        out["init"] = round(marks.get("init", 0) - marks.get("config", marks.get("machines", 0)), 1)
        after_init = max(marks.get("init", 0), marks.get("cni", 0), marks.get("storage", 0))
        out["join"] = round(marks["join"] - after_init, 1) if "join" in marks else 0
        out["ready"] = round(out["create to CoreDNS ready"] - created, 1)
    finally:
        _, out["delete"] = timed(subprocess.run, [str(kind), "delete", "cluster", "--name", name],
                                 capture_output=True)
    return out


def median(rounds: list[dict[str, float]], key: str) -> float | None:
    vals = [r[key] for r in rounds if key in r]
    return round(statistics.median(vals), 1) if vals else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster-config", default=str(ROOT / "configs" / "default.yaml"))
    ap.add_argument("--nodes", type=int, action="append", help="cluster sizes (default 1 and 3)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-kind", action="store_true", help="time the harness only")
    ap.add_argument("--suite", action="store_true", help="also run suites/kubeadm on each harness cluster")
    ap.add_argument("--uncached-build", action="store_true", help="also time a cold build (slow)")
    ap.add_argument("--growth", action="store_true",
                    help="only the harness's growth: 1, 3, 5, 10 nodes; 2 and 3 clusters at once")
    ap.add_argument("--growth-cluster-nodes", type=int, default=3, help="nodes of each concurrent cluster (3)")
    a = ap.parse_args()
    if a.rounds < 1 or any(n < 1 or n > 10 for n in a.nodes or []):
        ap.error("--rounds must be >= 1 and --nodes from 1 to 10")
    configure(verbose=False)
    version = load(a.cluster_config).version
    load1, load5, _ = os.getloadavg()
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "version": version, "cpus": os.cpu_count(),
                     "load before": [round(load1, 2), round(load5, 2)], "build": build_times(version, a.uncached_build)}
    image = node_image(version)
    if a.growth:
        rows = growth(Path(a.cluster_config), image, a.growth_cluster_nodes)
        results["growth"] = rows
        print(f"\n{version}, {os.cpu_count()} CPUs, load before {results['load before']}")
        keys = ("wall", "cpu seconds", "cpu seconds per node", "memory MiB", "memory MiB per node")
        print(f"   {'':36s} " + " ".join(f"{k:>12s}" for k in ("wall s", "CPU s", "CPU s/node", "MiB", "MiB/node")))
        for r in rows:
            print(f"   {r['what']:36s} " + " ".join(f"{r[k]:>12}" for k in keys))
        return _write(results)
    kind = None
    if not a.no_kind:
        from harness.build.kind import build_kind
        kind = build_kind() / "kind"
    tools = ["harness"] + (["kind"] if kind else [])
    for n in a.nodes or [1, 3]:
        rounds: dict[str, list] = {t: [] for t in tools}
        for r in range(a.rounds):
            for tool in tools if r % 2 == 0 else tools[::-1]:  # alternate who goes first
                res = harness_round(Path(a.cluster_config), n, image, a.suite) if tool == "harness" \
                    else kind_round(kind, n, image)
                rounds[tool].append(res)
                print(f"{n} node(s) round {r + 1} {tool}: {res}", flush=True)
        results[f"{n} node(s)"] = {"rounds": rounds,
                                   "median": {t: {k: median(rounds[t], k) for k in PHASES} for t in tools}}
    print(f"\n{version}, {os.cpu_count()} CPUs, {a.rounds} rounds, medians in seconds")
    for n in a.nodes or [1, 3]:
        med = results[f"{n} node(s)"]["median"]
        print(f"-- {n} node(s)\n   {'phase':26s} " + " ".join(f"{t:>8s}" for t in tools)
              + ("    ratio" if kind else ""))
        for k in PHASES:
            vals = [med[t][k] for t in tools]
            ratio = f"{vals[0] / vals[1]:9.2f}" if kind and vals[0] is not None and vals[1] else ""
            print(f"   {k:26s} " + " ".join(f"{v if v is not None else '-':>8}" for v in vals) + ratio)
    return _write(results)


def _write(results: dict) -> int:
    p = artifacts_dir() / "benchmark.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(results, indent=2))
    print(f"\nwritten {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
