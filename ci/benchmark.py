#!/usr/bin/env python3
"""Benchmark: time each phase of building and running a cluster.

  python ci/benchmark.py                 # 1-node and 3-node clusters
  python ci/benchmark.py --nodes 3 --uncached-build   # also time a cold build

Phases: build (cached/uncached), node image, machine start, kubeadm init,
joins, Ready, the kubeadm suite, teardown. Prints a table and writes
$ARTIFACTS/benchmark.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.controller import MachineController  # noqa: E402
from harness.kubeadm.bootstrap import KubeadmBootstrapper  # noqa: E402
from harness.progress import artifacts_dir, configure  # noqa: E402
from harness.reaper import current_owner  # noqa: E402
from harness.spec import load  # noqa: E402
from providers import registry  # noqa: E402


def timed(fn, *a, **kw):
    t0 = time.monotonic()
    out = fn(*a, **kw)
    return out, round(time.monotonic() - t0, 1)


def build_times(version: str, uncached: bool) -> dict[str, float]:
    from harness.build import kube, nodeimage
    res: dict[str, float] = {}
    if uncached:
        env = {**os.environ, "KUBE_HARNESS_CACHE": f"/tmp/kh-bench-cache-{uuid.uuid4().hex[:6]}",
               "GOCACHE": f"/tmp/kh-bench-gocache-{uuid.uuid4().hex[:6]}"}
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "harness.build", "--version", version], env=env, check=True, cwd=ROOT)
        res["build kubernetes (uncached, cold Go cache)"] = round(time.monotonic() - t0, 1)
    _, res["build kubernetes (cached)"] = timed(kube.build_kubernetes, version)
    base, res["base image (cached)"] = timed(nodeimage.base_image)
    _, res["node image (cached)"] = timed(nodeimage.build_node_image, version, base)
    return res


def cluster_times(cfg: Path, nodes: int, run_suite: bool) -> dict[str, float]:
    spec = load(cfg)
    name = f"bench{nodes}-{uuid.uuid4().hex[:4]}"
    doc = spec.to_dict()
    doc["metadata"]["name"] = name
    doc["spec"]["topology"]["controlPlane"]["replicas"] = 1
    workers = nodes - 1
    if workers:
        doc["spec"]["topology"]["workers"] = {"machineDeployments": [{"name": "md-0", "replicas": workers}]}
    else:
        doc["spec"]["topology"].pop("workers", None)
    from harness.spec import parse
    spec = parse(doc, "benchmark")
    provider = registry.get(spec.provider, spec.provider_options)
    ctl = MachineController(provider, current_owner(f"bench-{name}"), KubeadmBootstrapper())
    t0 = time.monotonic()
    cluster = ctl.provision(spec)
    out: dict[str, float] = {}
    try:
        out["provision total"] = round(time.monotonic() - t0, 1)
        t = cluster.timings
        out["node image"] = t.get("image", 0)
        starts = [v for k, v in t.items() if k.startswith("machine-start:")]
        out["machine start (slowest)"] = max(starts) if starts else 0
        out["machines (parallel)"] = t.get("machines", 0)
        out["kubeadm init"] = next((v for k, v in t.items() if k.startswith("init")), 0)
        out["joins"] = t.get("join", 0)
        out["Ready"] = t.get("ready", 0)
        if run_suite:
            kc = cluster.kubeconfig_path
            t1 = time.monotonic()
            r = subprocess.run([sys.executable, "-m", "pytest", "suites/kubeadm", "-q", "-p", "no:cacheprovider",
                                "--reuse-cluster", "--cluster-config", str(_write_cfg(doc))], cwd=ROOT,
                               env={**os.environ, "KUBECONFIG": str(kc)})
            out["kubeadm suite"] = round(time.monotonic() - t1, 1)
            out["kubeadm suite exit"] = r.returncode
    finally:
        _, out["teardown"] = timed(ctl.teardown, cluster)
    return out


def _write_cfg(doc: dict) -> Path:
    import yaml
    p = Path("/tmp") / f"kh-bench-{doc['metadata']['name']}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster-config", default=str(ROOT / "configs" / "default.yaml"))
    ap.add_argument("--nodes", type=int, action="append", help="cluster sizes (default 1 and 3)")
    ap.add_argument("--uncached-build", action="store_true", help="also time a cold build (slow)")
    ap.add_argument("--no-suite", action="store_true", help="skip running suites/kubeadm")
    a = ap.parse_args()
    configure(verbose=False)
    spec = load(a.cluster_config)
    results: dict[str, dict] = {"build": build_times(spec.version, a.uncached_build)}
    for n in a.nodes or [1, 3]:
        results[f"{n} node(s)"] = cluster_times(Path(a.cluster_config), n, not a.no_suite)
    print(f"\n{'phase':45s} {'seconds':>9s}")
    for group, rows in results.items():
        print(f"-- {group}")
        for k, v in rows.items():
            print(f"   {k:42s} {v:>9}")
    p = artifacts_dir() / "benchmark.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(results, indent=2))
    print(f"\nwritten {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
