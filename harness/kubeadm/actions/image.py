"""The node image action, and the host-limits check ``init`` starts with
(kept together: both are about what the host provides the nodes)."""
from __future__ import annotations

import threading

from harness.cluster import Cluster
from providers.base import HostLimits, MissingCapability, NodeImages

from ..validate import check_kubeadm_patches


class ImageAction:
    """The node image per version, chosen (and built) once per process."""

    def __init__(self, node_image: str | None = None):
        self.node_image = node_image or None
        self._images: dict[str, str] = {}
        self._lock = threading.Lock()

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
            raise MissingCapability(cluster.provider, NodeImages, f"a node image for Kubernetes {version}; "
                                    f"set spec.provider.options.image or --node-image")
        if opts.get("image"):
            return cluster.provider.node_image(version, **opts)
        with self._lock:
            if version not in self._images:
                self._images[version] = cluster.provider.node_image(version, **opts)
            return self._images[version]


def check_host_limits(cluster: Cluster) -> None:
    """init's first step: the provider warns when host limits make kubelets fail."""
    p = cluster.provider
    if isinstance(p, HostLimits):
        p.check_host_limits(cluster.name)
