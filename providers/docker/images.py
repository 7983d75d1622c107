"""The images node containers boot from: the base image (machines without
Kubernetes, the load balancer), node images of a Kubernetes version built by
:mod:`harness.build.nodeimage` with the suites' test images preloaded, and
prebuilt images the user names, which must exist locally (nothing is pulled)."""
from __future__ import annotations

import logging

from providers.base import ProviderError

log = logging.getLogger("harness.provider.docker")


def base_image() -> str:
    from providers.docker.nodeimage.base import build_base_image
    return build_base_image()


def node_image_problem(image: str) -> str | None:
    """Why ``image`` cannot boot node containers (None when it exists locally)."""
    try:
        from harness.build.nodeimage import image_problem
    except ImportError:
        return None
    return image_problem(image)


def node_image(version: str | None, image: str | None = None) -> str:
    """``image`` when given (it must exist locally), the base image without a
    Kubernetes version, else the node image of the version (built if missing)."""
    if image:
        try:
            from harness.build.nodeimage import check_image
        except ImportError:
            return str(image)
        return check_image(str(image))
    if version is None:
        return base_image()
    try:
        from harness.build.nodeimage import build_node_image
    except ImportError as e:
        raise ProviderError(f"no node image for {version}: harness.build.nodeimage is not available "
                            f"({e}); set spec.provider.options.image or --node-image") from e
    # the suites' busybox goes into the preload too (ensure_loaded is the fallback)
    extra: list[str] = []
    try:
        from harness.build.testimages import test_images
        extra = test_images()
    except Exception as e:
        log.warning(f"test images not built, node image without them: {e}", extra={"phase": "image"})
    # base image: the builder's default (the provider's base without VOLUME /var)
    return build_node_image(version, extra_images=extra)
