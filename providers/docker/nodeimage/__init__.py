"""Node images for the docker provider: the base image (``base``) is built
here from Debian packages; the Kubernetes node image is built on top of it."""
from .base import DEFAULT_SANDBOX_IMAGE, REPOSITORY, base_cache_dir, build_base_image, cache_dir, image_tag

__all__ = ["build_base_image", "image_tag", "cache_dir", "base_cache_dir", "REPOSITORY", "DEFAULT_SANDBOX_IMAGE"]
