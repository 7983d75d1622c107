"""The images CAPD runs, made from the harness's own images.

CAPD starts what its templates name, from the host's Docker engine, and
never needs a registry when the images are there:

* nodes: ``kindest/node:<version>`` (the quick-start ClusterClass's
  customImage); the harness's node image is tagged so;
* load balancers: ``kindest/haproxy:<tag>`` (CAPD's default repository and
  tag), running ``haproxy -W -db -f /usr/local/etc/haproxy/haproxy.cfg``:
  the node base image's haproxy, with that as its command (its connection
  limit fitted to the container's descriptor limit, see
  :data:`HAPROXY_WRAPPER`) and no ``VOLUME``
  (CAPD removes the container, an anonymous volume would stay behind).
"""
from __future__ import annotations

import io
import tarfile

import docker

from providers.docker.nodeimage.base import build_base_image

NODE_REPOSITORY = "kindest/node"
#: the label CAPD (as kind) puts on a cluster's containers
CLUSTER_LABEL = "io.x-k8s.kind.cluster"
#: CAPD's network; it attaches machines to it but does not create it
NETWORK = "kind"
#: CAPD's loadbalancer.DefaultImageRepository / DefaultImageTag (test/infrastructure/docker/internal/loadbalancer)
LB_IMAGE = "kindest/haproxy:v20230606-42a2262b"
LB_RECIPE = "3"  # bump when the image's recipe changes
HAPROXY_CONFIG = "/usr/local/etc/haproxy/haproxy.cfg"
#: CAPD starts "haproxy -W -db -f <config>" itself. Its config asks for maxconn
#: 100000 (200k descriptors); where the container's hard limit is lower (20000
#: on this host) haproxy 2.6 refuses to start. This wrapper, first in PATH, fits
#: the limit with -n (which wins over the config, and stays on reloads).
HAPROXY_WRAPPER = """#!/bin/sh
h=$(ulimit -Hn); n=100000
if [ "$h" != unlimited ] && [ $((h / 2 - 500)) -lt $n ]; then n=$((h / 2 - 500)); fi
exec /usr/sbin/haproxy -n "$n" "$@"
"""
WRAPPER_PATH = "/usr/local/sbin/haproxy"


def tag_node_image(image: str, version: str) -> str:
    """``image`` also as ``kindest/node:<version>``; returns that tag."""
    client = docker.from_env()
    try:
        repo, tag = NODE_REPOSITORY, version.replace("+", "_")
        client.images.get(image).tag(repo, tag)
        return f"{repo}:{tag}"
    finally:
        client.close()


def machine_networks(network: str = NETWORK) -> dict[str, list[str]]:
    """The subnets of the Docker network CAPD puts machines on (none before it exists)."""
    client = docker.from_env()
    try:
        nets = [n for n in client.api.networks(names=[network]) if n.get("Name") == network]
        return {network: [c["Subnet"] for n in nets for c in ((n.get("IPAM") or {}).get("Config") or [])
                          if c.get("Subnet")]}
    finally:
        client.close()


def remove_leftovers(cluster: str) -> list[str]:
    """Force-remove what CAPD made for ``cluster`` and left behind (containers labelled with
    it, volumes named after it): the last step of a teardown, for a Cluster its controllers
    can no longer delete (say, moved into a workload cluster that then broke)."""
    from providers.docker.cleanup import Cleanup
    from providers.docker.engine import Engine
    engine = Engine()
    cleanup = Cleanup(engine)  # force removal, frozen cgroups thawed, volumes waited for
    try:
        gone = []
        for c in engine.api.containers(all=True, filters={"label": f"{CLUSTER_LABEL}={cluster}"}):
            name = c["Names"][0].lstrip("/")
            cleanup.remove_container(c["Id"], name)
            gone.append(name)
        for v in engine.api.volumes().get("Volumes") or []:
            if v["Name"].startswith(f"{cluster}-") and cleanup.remove_volume(v["Name"]):
                gone.append(v["Name"])
        return gone
    finally:
        engine.close()


def prepare_node_image(version: str) -> str:
    """The harness's node image of ``version`` (built or cached, with the test images)
    where CAPD's templates look for it."""
    from harness.build import testimages
    from harness.build.nodeimage import build_node_image
    return tag_node_image(build_node_image(version, extra_images=testimages.test_images()), version)


def build_lb_image() -> str:
    """CAPD's load balancer image (see module doc); rebuilt when the base image changes."""
    base = build_base_image(volume_var=False)
    client = docker.from_env()
    try:
        try:
            labels = client.images.get(LB_IMAGE).labels or {}
            if labels.get("harness.k8s.io/base") == base and labels.get("harness.k8s.io/recipe") == LB_RECIPE:
                return LB_IMAGE
        except docker.errors.ImageNotFound:
            pass
        dockerfile = (f"FROM {base}\n"
                      f"COPY haproxy {WRAPPER_PATH}\n"
                      "ENTRYPOINT []\n"
                      f'CMD ["haproxy", "-W", "-db", "-f", "{HAPROXY_CONFIG}"]\n'
                      "STOPSIGNAL SIGTERM\n"
                      f'LABEL harness.k8s.io/image="capd-haproxy" harness.k8s.io/base="{base}" '
                      f'harness.k8s.io/recipe="{LB_RECIPE}"\n')
        context = io.BytesIO()
        with tarfile.open(fileobj=context, mode="w") as tf:
            for name, data, mode in (("Dockerfile", dockerfile, 0o644), ("haproxy", HAPROXY_WRAPPER, 0o755)):
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data.encode()), mode
                tf.addfile(info, io.BytesIO(data.encode()))
        context.seek(0)
        client.images.build(fileobj=context, custom_context=True, tag=LB_IMAGE, rm=True, forcerm=True,
                            pull=False, nocache=True)
        return LB_IMAGE
    finally:
        client.close()
