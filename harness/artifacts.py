"""Failure artifacts in the Prow layout under $ARTIFACTS (default ./_artifacts):
clusters/<namespace>-<name>/<machine>/... per machine logs, the spec used,
phase timings, and a cluster dump when the API answers."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import yaml

from .cluster import Cluster
from .progress import artifacts_dir, phase

log = logging.getLogger("harness.artifacts")


def cluster_dir(cluster: Cluster, root: Path | None = None) -> Path:
    d = (root or artifacts_dir()) / "clusters" / f"{cluster.namespace}-{cluster.name}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def write_spec(cluster: Cluster, root: Path | None = None) -> Path:
    p = cluster_dir(cluster, root) / "cluster.yaml"
    p.write_text(yaml.safe_dump(cluster.spec.to_dict(), sort_keys=False))
    return p


def collect(cluster: Cluster, root: Path | None = None, reason: str = "failure") -> Path:
    """Collect everything useful for debugging; never raises."""
    d = cluster_dir(cluster, root)
    with phase("artifacts", cluster=cluster.name):
        try:
            write_spec(cluster, root)
            (d / "timings.json").write_text(json.dumps(cluster.timings, indent=2))
            (d / "reason.txt").write_text(reason + "\n")
        except Exception as e:
            log.warning(f"writing spec failed: {e}")
        try:
            machines = cluster.provider.list_machines(cluster.name, cluster.namespace)
        except Exception as e:
            log.warning(f"listing machines failed: {e}")
            machines = []
        for m in machines:
            try:
                md = d / m.name
                md.mkdir(exist_ok=True)
                cluster.provider.collect_artifacts(m, str(md))
            except Exception as e:
                log.warning(f"collecting {m.name} failed: {e}", extra={"machine": m.name})
        cps = [m for m in machines if m.role == "control-plane" and m.state == "running"]
        if cps:
            try:
                r = cluster.provider.exec(cps[0], ["kubectl", "--kubeconfig=/etc/kubernetes/admin.conf",
                                                   "cluster-info", "dump", "--all-namespaces"],
                                          check=False, timeout=90)
                if r.ok:
                    (d / "cluster-info-dump.txt").write_text(r.stdout)
            except Exception as e:
                log.warning(f"cluster dump failed: {e}")
    log.info(f"artifacts written to {d}", extra={"cluster": cluster.name})
    return d
