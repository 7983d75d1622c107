"""The images CAPD runs, made from the harness's own images.

CAPD starts what its templates name, from the host's Docker engine, and
never needs a registry when the images are there:

* nodes: ``kindest/node:<version>`` (the quick-start ClusterClass's
  customImage); the harness's node image is tagged so;
* load balancers: ``kindest/haproxy:<tag>`` (CAPD's default repository and
  tag), running ``haproxy -W -db -f /usr/local/etc/haproxy/haproxy.cfg``:
  the node base image's haproxy, with that as its command and no ``VOLUME``
  (CAPD removes the container, an anonymous volume would stay behind).
"""
from __future__ import annotations

import io

import docker

from providers.docker.nodeimage.base import build_base_image

NODE_REPOSITORY = "kindest/node"
#: CAPD's loadbalancer.DefaultImageRepository / DefaultImageTag (test/infrastructure/docker/internal/loadbalancer)
LB_IMAGE = "kindest/haproxy:v20230606-42a2262b"
HAPROXY_CONFIG = "/usr/local/etc/haproxy/haproxy.cfg"


def tag_node_image(image: str, version: str) -> str:
    """``image`` also as ``kindest/node:<version>``; returns that tag."""
    client = docker.from_env()
    try:
        repo, tag = NODE_REPOSITORY, version.replace("+", "_")
        client.images.get(image).tag(repo, tag)
        return f"{repo}:{tag}"
    finally:
        client.close()


def build_lb_image() -> str:
    """CAPD's load balancer image (see module doc); rebuilt when the base image changes."""
    base = build_base_image(volume_var=False)
    client = docker.from_env()
    try:
        try:
            if client.images.get(LB_IMAGE).labels.get("harness.k8s.io/base") == base:
                return LB_IMAGE
        except docker.errors.ImageNotFound:
            pass
        dockerfile = (f"FROM {base}\n"
                      "ENTRYPOINT []\n"
                      f'CMD ["haproxy", "-W", "-db", "-f", "{HAPROXY_CONFIG}"]\n'
                      "STOPSIGNAL SIGTERM\n"
                      f'LABEL harness.k8s.io/image="capd-haproxy" harness.k8s.io/base="{base}"\n')
        client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=LB_IMAGE, rm=True, forcerm=True,
                            pull=False, nocache=True)
        return LB_IMAGE
    finally:
        client.close()
