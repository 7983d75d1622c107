"""python -m harness.build --version v1.37.2 [--node-image] [--e2e] [--e2e-kubeadm] [--capi] [--kind] [--release-dir DIR]"""
from __future__ import annotations

import argparse
import os
import sys
import time

from ..progress import configure
from . import images, kube
from .cache import BuildError


def main(argv: list[str] | None = None, prog: str = "python -m harness.build") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__)
    ap.add_argument("--version", default=None, help="Kubernetes version (default: harness.versions.DEFAULT_VERSION)")
    ap.add_argument("--node-image", action="store_true", help="also build the node image (preloaded images)")
    ap.add_argument("--e2e", action="store_true",
                    help="also build e2e.test, e2e_kubeadm.test, ginkgo, the e2e test images and the registry "
                         "that serves them")
    ap.add_argument("--e2e-kubeadm", action="store_true",
                    help="also build e2e_kubeadm.test, kubeadm's own e2e suite (suites/kubeadm runs it)")
    ap.add_argument("--capi", action="store_true",
                    help="also build the upstream Cluster API managers, clusterctl, kustomize, the providers' "
                         "components and the managers' images (the capi-build module)")
    ap.add_argument("--kind", action="store_true",
                    help="also build the kind CLI (sigs.k8s.io/kind, harness.build.kind), which runs the node image")
    ap.add_argument("--release-dir", default=None,
                    help="use official release binaries from this directory ({version} is replaced) instead of "
                         "building; same as $KUBE_HARNESS_RELEASE_DIR")
    a = ap.parse_args(argv)
    configure()
    t0 = time.monotonic()
    try:
        version = a.version or kube.default_version()
        if a.release_dir:  # the node image and component images take the same binaries
            os.environ[kube.RELEASE_DIR_ENV] = a.release_dir
        kd = kube.build_kubernetes(version)
        print(f"kubernetes {version}: {kd / 'bin'}")
        if a.node_image:
            from .nodeimage import build_node_image
            print(f"node image: {build_node_image(version)}")
        else:
            for t in images.build_component_images(version, kd):
                print(f"image: {t}")
        if a.e2e:
            from . import e2e, e2eimages
            print(f"e2e.test: {e2e.ensure_e2e(version)}")
            print(f"ginkgo: {e2e.ensure_ginkgo()}")
            e2eimages.build_e2e_images(version)
            from .runtime import build_registry
            print(f"registry: {build_registry()}")  # serves the e2e images in the cluster
        if a.e2e or a.e2e_kubeadm:
            from .e2e import ensure_e2e_kubeadm
            print(f"e2e_kubeadm.test: {ensure_e2e_kubeadm(version)}")
        if a.capi:
            from . import capi
            cd = capi.build_capi()
            print(f"cluster-api: {cd}")
            for provider, tag in capi.build_capi_images(cd).items():
                print(f"image: {tag} ({provider})")
        if a.kind:
            from .kind import build_kind
            print(f"kind: {build_kind() / 'kind'}")  # build_kind returns the bin directory
    except BuildError as e:
        print(f"build failed: {e}", file=sys.stderr)
        return 1
    print(f"done in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
