"""The e2e test images' names: the ``k8s.io/kubernetes`` module's
``test/utils/image/manifest.go`` (so a local tag is exactly what e2e.test asks
for, e.g. ``kube-harness.local/e2e-test-images/agnhost:2.56``), the image
lists the conformance runs need, and the ``KUBE_TEST_REPO_LIST`` file that
points e2e.test at the local names (:func:`repo_list`)."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from . import kube
from .cache import BuildError, cache_dir as _cache_dir, log, run

REGISTRY = os.environ.get("KUBE_HARNESS_E2E_REGISTRY", "kube-harness.local")

#: the images the [Conformance] specs run (ImageID names from manifest.go); those a release's
#: manifest does not have are left out (v1.37 replaced JessieDnsutils and Httpd, and runs
#: StatefulSets on AgnhostPrev)
CONFORMANCE_IMAGES = (
    "Agnhost", "AgnhostPrev", "BusyBox", "Pause", "JessieDnsutils", "GlibcDnsTesting", "Nginx", "NginxNew",
    "Httpd", "HttpdNew", "Nautilus", "Kitten", "NonRoot", "Nonewprivs", "APIServer", "Etcd",
)
#: enough for the smoke subset
SMOKE_IMAGES = ("Agnhost", "BusyBox", "Pause", "JessieDnsutils", "GlibcDnsTesting", "Httpd", "HttpdNew", "Nginx",
                "NginxNew")

#: registry keys that must keep their upstream (unreachable) value: tests
#: expect pulls from them to fail, or they need credentials we do not have
_KEEP_UPSTREAM = ("invalidRegistry", "privateRegistry", "gcAuthenticatedRegistry")


# --------------------------------------------------------------- manifest

@dataclass(frozen=True)
class ImageRef:
    """One ``configs[ID] = Config{list.X, name, version}`` of manifest.go."""
    id: str
    registry_key: str  # yaml key, e.g. promoterE2eRegistry
    name: str
    version: str
    upstream_registry: str

    @property
    def upstream(self) -> str:
        return f"{self.upstream_registry}/{self.name}:{self.version}"

    def local(self, registry: str = REGISTRY) -> str:
        return f"{repo_list(registry)[self.registry_key]}/{self.name}:{self.version}"


def cache_dir() -> Path:
    """``$KUBE_HARNESS_CACHE/e2e-images``: rootfs tarballs, binaries, .debs, repo lists."""
    d = _cache_dir() / "e2e-images"
    d.mkdir(parents=True, exist_ok=True)
    return d


def module_dir(version: str | None = None) -> Path:
    """The k8s.io/kubernetes module source (manifest.go, test/images files) in
    the module cache, downloaded through the Go module proxy if missing.
    Go commands are always built from the kube-build module's graph."""
    pinned = kube.pinned_version()
    if not version or version == pinned:
        cmd = ["go", "list", "-m", "-json", "k8s.io/kubernetes"]
    else:
        log.warning(f"e2e images for {version}: names from its manifest.go, Go commands from the kube-build "
                    f"module ({pinned})")
        cmd = ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{version}"]
    cwd = kube.pinned_module()
    d = json.loads(run(cmd, cwd=cwd, stderr=False, what="locate k8s.io/kubernetes")).get("Dir")
    if not d and cmd[1] == "list":
        run(["go", "mod", "download", "k8s.io/kubernetes"], cwd=cwd, what="go mod download k8s.io/kubernetes")
        d = json.loads(run(cmd, cwd=cwd, stderr=False, what="locate k8s.io/kubernetes")).get("Dir")
    if not d:
        raise BuildError("cannot locate the k8s.io/kubernetes module source")
    return Path(d)


def parse_manifest(text: str) -> dict[str, ImageRef]:
    """ImageID name -> ImageRef, from the text of manifest.go."""
    fields = dict(re.findall(r"^\s*(\w+)\s+string\s+`yaml:\"(\w+)\"`", text, re.M))
    init_block = re.search(r"initRegistry\s*=\s*RegistryList\{(.*?)\n\t\}", text, re.S)
    defaults = dict(re.findall(r"(\w+):\s*\"([^\"]+)\"", init_block.group(1))) if init_block else {}
    refs = {}
    for ident, field, name, version in re.findall(
            r"configs\[(\w+)\]\s*=\s*Config\{list\.(\w+),\s*\"([^\"]+)\",\s*\"([^\"]+)\"\}", text):
        key = fields.get(field, field[:1].lower() + field[1:])
        refs[ident] = ImageRef(ident, key, name, version, defaults.get(field, ""))
    if "Agnhost" not in refs:
        raise BuildError("manifest.go: no image configs found (format changed?)")
    return refs


def manifest(version: str | None = None) -> dict[str, ImageRef]:
    return parse_manifest((module_dir(version) / "test/utils/image/manifest.go").read_text())


def repo_list(registry: str = REGISTRY) -> dict[str, str]:
    """The KUBE_TEST_REPO_LIST content: every registry key e2e.test knows,
    mapped under ``registry`` (except the ones that must stay unreachable)."""
    m = {
        "promoterE2eRegistry": f"{registry}/e2e-test-images",
        "buildImageRegistry": f"{registry}/build-image",
        "gcEtcdRegistry": registry,
        "gcRegistry": registry,
        "sigStorageRegistry": f"{registry}/sig-storage",
        "dockerLibraryRegistry": f"{registry}/library",
        "cloudProviderGcpRegistry": f"{registry}/cloud-provider-gcp",
        "invalidRegistry": "invalid.registry.k8s.io/invalid",
        "privateRegistry": "gcr.io/k8s-authenticated-test",
        "gcAuthenticatedRegistry": "gcr.io/authenticated-image-pulling",
    }
    return m


def write_repo_list(path: Path | str | None = None, registry: str = REGISTRY) -> Path:
    import yaml
    p = Path(path) if path else cache_dir() / f"repo-list-{registry}.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    body = "# KUBE_TEST_REPO_LIST for e2e.test: images built locally by harness/build/e2eimages.py\n"
    body += yaml.safe_dump(repo_list(registry), sort_keys=True)
    if not p.exists() or p.read_text() != body:
        p.write_text(body)
    return p
