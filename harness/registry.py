"""An image registry inside the cluster for images that only exist locally.

Some e2e specs pull with ``imagePullPolicy: Always`` (ImageVolume in v1.35+),
which resolves the image in its registry even when the node has it. There is
no registry to reach here, so the first control plane runs the upstream
distribution registry (built from the Go module proxy) as a systemd unit, the
images already loaded into its containerd are pushed to it, and every node's
containerd resolves the registry host (e.g. ``kube-harness.local``) there
(``/etc/containerd/certs.d/<host>/hosts.toml``). Only exec and file copies
are used, so it works with any provider.
"""
from __future__ import annotations

import logging
import shlex
from typing import Iterable

from .images_load import CTR_NAMESPACE, normalize
from .progress import phase

log = logging.getLogger("harness.registry")

PORT = 5000
BINARY = "/usr/local/bin/kh-registry"
CONFIG = "/etc/kube-harness/registry.yml"
UNIT = "kh-registry"
STORAGE = "/var/lib/kh-registry"
_CONFIG = f"""version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {STORAGE}
  delete:
    enabled: false
http:
  addr: :{PORT}
"""


def hosts_toml(endpoint: str) -> str:
    """containerd's hosts.toml sending pulls of a registry host to ``endpoint``."""
    return (f'server = "{endpoint}"\n\n[host."{endpoint}"]\n  capabilities = ["pull", "resolve"]\n'
            "  skip_verify = true\n")


def serve(cluster, tags: Iterable[str], host: str) -> str:
    """Serve ``tags`` (names under ``host``, already loaded into the nodes)
    from a registry on the first control plane; returns its endpoint."""
    from .build.runtime import build_registry
    tags = [t for t in dict.fromkeys(tags) if t.startswith(host + "/")]
    m = cluster.control_planes[0]
    endpoint = f"http://[{m.ip}]:{PORT}" if ":" in m.ip else f"http://{m.ip}:{PORT}"
    with phase("registry", cluster=cluster.name, machine=m.name):
        _start(cluster, m, build_registry() / "bin" / "registry")
        for t in tags:
            remote = f"127.0.0.1:{PORT}/{t[len(host) + 1:]}"
            cluster.exec(m, ["ctr", "-n", CTR_NAMESPACE, "images", "push", "--plain-http", remote, normalize(t)],
                         timeout=600)
        for node in cluster.machines():
            cluster.provider.copy_to(node, f"/etc/containerd/certs.d/{host}/hosts.toml",
                                     hosts_toml(endpoint).encode(), mode=0o644)
        log.info(f"{len(tags)} images served from {endpoint} as {host}",
                 extra={"cluster": cluster.name, "phase": "registry"})
    return endpoint


def _start(cluster, m, binary) -> None:
    if cluster.exec(m, ["systemctl", "is-active", "--quiet", UNIT], check=False).ok:
        return
    cluster.provider.copy_to(m, BINARY, binary.read_bytes(), mode=0o755)
    cluster.provider.copy_to(m, CONFIG, _CONFIG.encode(), mode=0o644)
    cluster.exec(m, ["systemd-run", f"--unit={UNIT}", "--property=Restart=always", BINARY, "serve", CONFIG])
    url = shlex.quote(f"http://127.0.0.1:{PORT}/v2/")
    cluster.exec(m, f"for i in $(seq 1 50); do curl -sf {url} >/dev/null && exit 0; sleep 0.2; done; "
                    f"journalctl -u {UNIT} --no-pager | tail -20; exit 1", timeout=60)
