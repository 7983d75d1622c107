"""The real upstream Cluster API controllers from the Go module proxy.

``capi-build`` (harness/build/sources/capi-build, run from its copy in the
cache) is a Go module whose ``tool`` directives pin the core
manager (sigs.k8s.io/cluster-api, the module root package), the kubeadm
bootstrap and control-plane managers, clusterctl, CAPD (package
test/infrastructure/docker of module sigs.k8s.io/cluster-api/test) and
kustomize. ``build_capi()`` ``go build``s them static with the version
ldflags of upstream's hack/version.sh, renders every provider's
config/default with that kustomize (raw: ``${VAR:=default}`` and staging
image placeholders are left for whoever deploys them) and copies clusterctl's
metadata.yaml per provider. Output is cached under
$KUBE_HARNESS_CACHE/capi-build/<version>-<hash12>/ (bin/, components/,
metadata/), keyed by go.mod, go.sum, ldflags and the Go version; the
completion marker is written last. ``build_capi_images()`` makes each
manager a ``docker import``ed image (the static binary as /manager).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..progress import phase
from .cache import BuildError, cache_dir, digest, file_digest, go_module, is_complete, log, produce, run, source
from .images import binary_image
from .kube import BUILD_DATE, go_env, go_version
from .runtime import check_binary

CAPI_BUILD = source("capi-build")  # read-only; go runs in go_module("capi-build")
CORE_MODULE = "sigs.k8s.io/cluster-api"
TEST_MODULE = "sigs.k8s.io/cluster-api/test"  # CAPD lives here
KUSTOMIZE_MODULE = "sigs.k8s.io/kustomize/kustomize/v5"
VERSION_PKG = "sigs.k8s.io/cluster-api/version"
#: where upstream releases the managers' images; clusterctl wants canonical names
IMAGE_REPOSITORY = "registry.k8s.io/cluster-api"
IMAGE_NAMES = {"core": "cluster-api-controller", "bootstrap-kubeadm": "kubeadm-bootstrap-controller",
               "control-plane-kubeadm": "kubeadm-control-plane-controller", "infrastructure-docker": "capd-manager"}


@dataclass(frozen=True)
class Provider:
    name: str        # clusterctl's <type>-<name>, as components/<name>.yaml
    binary: str      # bin/<binary>
    package: str     # Go main package
    module: str      # module that holds it (its version is the one reported)
    config: str      # kustomize dir inside the module
    metadata: str    # clusterctl metadata.yaml inside the module
    user: str        # image user, as upstream's Dockerfiles (distroless nonroot; CAPD root for docker.sock)


PROVIDERS = (
    Provider("core", "capi-manager", CORE_MODULE, CORE_MODULE, "config/default", "metadata.yaml", "65532:65532"),
    Provider("bootstrap-kubeadm", "capi-kubeadm-bootstrap-manager", f"{CORE_MODULE}/bootstrap/kubeadm", CORE_MODULE,
             "bootstrap/kubeadm/config/default", "metadata.yaml", "65532:65532"),
    Provider("control-plane-kubeadm", "capi-kubeadm-control-plane-manager", f"{CORE_MODULE}/controlplane/kubeadm",
             CORE_MODULE, "controlplane/kubeadm/config/default", "metadata.yaml", "65532:65532"),
    # the test module has no root metadata.yaml; upstream's e2e config takes CAPD's from here
    Provider("infrastructure-docker", "capd-manager", f"{TEST_MODULE}/infrastructure/docker", TEST_MODULE,
             "infrastructure/docker/config/default", "e2e/data/shared/main/metadata.yaml", ""),
)
CLUSTERCTL = ("clusterctl", f"{CORE_MODULE}/cmd/clusterctl", CORE_MODULE)
KUSTOMIZE = ("kustomize", KUSTOMIZE_MODULE, KUSTOMIZE_MODULE)
BINARIES = tuple((p.binary, p.package, p.module) for p in PROVIDERS) + (CLUSTERCTL, KUSTOMIZE)
VERSION_ARGS = {"clusterctl": (["version", "-o", "short"], "{}"), "kustomize": (["version"], "{}")}


def pinned_versions() -> dict[str, str]:
    """module -> version that capi-build's go.mod requires, for the modules built here."""
    text = (CAPI_BUILD / "go.mod").read_text()
    out = {}
    for mod in (CORE_MODULE, TEST_MODULE, KUSTOMIZE_MODULE):
        m = re.search(rf"^\s*(?:require\s+)?{re.escape(mod)} (v\S+)", text, re.M)
        if not m:
            raise BuildError(f"{CAPI_BUILD}/go.mod does not pin {mod}")
        out[mod] = m.group(1)
    return out


def ldflags(module: str, version: str) -> str:
    """As upstream's hack/version.sh (cluster-api) or its release build (kustomize)."""
    flags = ["-s", "-w"]
    if module == KUSTOMIZE_MODULE:  # its version comes from the build info (the module's own version)
        return " ".join(flags + [f"-X sigs.k8s.io/kustomize/api/provenance.buildDate={BUILD_DATE}"])
    m = re.match(r"^v(\d+)\.(\d+)\.\d+$", version)
    if not m:
        raise BuildError(f"{module} {version!r}; allowed: vMAJOR.MINOR.PATCH")
    pairs = {"gitVersion": version, "gitMajor": m.group(1), "gitMinor": m.group(2), "gitTreeState": "clean",
             "gitCommit": "0" * 40, "buildDate": BUILD_DATE}
    return " ".join(flags + [f"-X {VERSION_PKG}.{k}={v}" for k, v in pairs.items()])


def module_dirs() -> dict[str, Path]:
    """module -> its directory in the Go module cache (downloaded if needed; read-only)."""
    out = {}
    for mod in (CORE_MODULE, TEST_MODULE):
        d = json.loads(run(["go", "mod", "download", "-json", mod], cwd=go_module("capi-build"), env=go_env(),
                           what=f"go mod download {mod}")).get("Dir") or ""
        if not d or not Path(d).is_dir():
            raise BuildError(f"{mod}: module directory {d!r} not found")
        out[mod] = Path(d)
    return out


def output_dir() -> Path:
    versions = pinned_versions()
    flags = {b: ldflags(mod, versions[mod]) for b, _, mod in BINARIES}
    key = digest("capi-v1", CAPI_BUILD / "go.mod", CAPI_BUILD / "go.sum", go_version(), flags, PROVIDERS, BINARIES)
    return cache_dir() / "capi-build" / f"{versions[CORE_MODULE]}-{key[:12]}"


def build_capi(force: bool = False) -> Path:
    """Cache dir with bin/{capi-manager, capi-kubeadm-bootstrap-manager,
    capi-kubeadm-control-plane-manager, capd-manager, clusterctl, kustomize},
    components/<provider>.yaml (raw ``kustomize build`` of config/default) and
    metadata/<provider>.yaml."""
    versions = pinned_versions()
    core = versions[CORE_MODULE]

    def build(tmp: Path) -> dict:
        for sub in ("bin", "components", "metadata"):
            (tmp / sub).mkdir()
        bindir = tmp / "bin"
        with phase("build-capi", machine=core):
            for binary, pkg, mod in BINARIES:
                run(["go", "build", "-trimpath", "-ldflags", ldflags(mod, versions[mod]), "-o", str(bindir / binary),
                     pkg], cwd=go_module("capi-build"), env=go_env(), what=f"go build {binary} {versions[mod]}")
                # static, and reports its version (managers have no --version: they log it first thing,
                # then fail on the missing kubeconfig)
                args, expect = VERSION_ARGS.get(binary, (["--kubeconfig=/nonexistent"], "Version: {} ("))
                check_binary(bindir / binary, args, expect.format(versions[mod]))
        with phase("capi-components", machine=core):
            dirs = module_dirs()
            for p in PROVIDERS:
                dest = tmp / "components" / f"{p.name}.yaml"
                run([str(bindir / "kustomize"), "build", str(dirs[p.module] / p.config), "-o", str(dest)],
                    what=f"kustomize build {p.name}")
                if "kind: CustomResourceDefinition" not in dest.read_text():
                    raise BuildError(f"kustomize build {p.module}/{p.config}: no CustomResourceDefinition")
                meta = dirs[p.module] / p.metadata
                if meta.is_file():
                    (tmp / "metadata" / f"{p.name}.yaml").write_bytes(meta.read_bytes())
        sha = {b.name: file_digest(b) for b in sorted(bindir.iterdir())}
        return {"versions": versions, "go": go_version(), "sha256": sha}
    out = output_dir()
    if not force and is_complete(out):
        log.info(f"cluster-api {core}: cached at {out}", extra={"phase": "build-capi"})
    return produce(out, build, force)


def provider_versions() -> dict[str, str]:
    """provider -> the version its manager reports (CAPD: the test module's)."""
    versions = pinned_versions()
    return {p.name: versions[p.module] for p in PROVIDERS}


def image_tag(provider: str) -> str:
    """The upstream release's image name, e.g. registry.k8s.io/cluster-api/capd-manager:v1.13.7."""
    return f"{IMAGE_REPOSITORY}/{IMAGE_NAMES[provider]}:{provider_versions()[provider]}"


def build_capi_images(capi_dir: Path | None = None) -> dict[str, str]:
    """provider -> image tag: each manager's static binary as /manager in a
    minimal rootfs (``docker import``), cached by the binary's content."""
    capi_dir = capi_dir or build_capi()
    tags = {}
    with phase("capi-images"):
        for p in PROVIDERS:
            tag, binary = image_tag(p.name), capi_dir / "bin" / p.binary
            h = digest("capi-image-v1", tag, file_digest(binary), p.user)
            tags[p.name] = binary_image(tag, {"manager": binary}, ["/manager"], h, user=p.user)
    return tags
