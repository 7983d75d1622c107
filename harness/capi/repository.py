"""A local clusterctl provider repository made from the built providers.

clusterctl reads providers from repositories named in its config file; a
``file://`` URL is a local repository laid out as
``<provider>/<version>/{<type>-components.yaml, metadata.yaml, templates}``.
This module writes one from :func:`harness.build.capi.build_capi`'s output,
as upstream's ``make release-manifests`` would have: each manager's image
is the locally built one (never pulled: ``imagePullPolicy: IfNotPresent``);
``${VAR:=default}`` placeholders are left for clusterctl to substitute.
CAPD's cluster templates and ClusterClass come from its module.

The repository and its ``clusterctl.yaml`` live in a directory keyed by
their content, so processes sharing a cache share one repository.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.build import capi as capi_build
from harness.build.cache import cache_dir, digest, produce

#: build provider name -> (clusterctl provider name, type, components file name)
CLUSTERCTL_NAMES = {
    "core": ("cluster-api", "CoreProvider", "core-components.yaml"),
    "bootstrap-kubeadm": ("kubeadm", "BootstrapProvider", "bootstrap-components.yaml"),
    "control-plane-kubeadm": ("kubeadm", "ControlPlaneProvider", "control-plane-components.yaml"),
    "infrastructure-docker": ("docker", "InfrastructureProvider", "infrastructure-components.yaml"),
}
TYPE_PREFIX = {"CoreProvider": "", "BootstrapProvider": "bootstrap-", "ControlPlaneProvider": "control-plane-",
               "InfrastructureProvider": "infrastructure-"}
CAPD_TEMPLATES = "infrastructure/docker/templates"


@dataclass(frozen=True)
class Repository:
    root: Path
    config: Path  # clusterctl.yaml naming every provider of the repository
    versions: dict[str, str]  # build provider name -> version

    def init_args(self) -> list[str]:
        """``clusterctl init`` arguments for every provider of this repository."""
        flag = {"CoreProvider": "--core", "BootstrapProvider": "--bootstrap",
                "ControlPlaneProvider": "--control-plane", "InfrastructureProvider": "--infrastructure"}
        out: list[str] = []
        for p, (name, kind, _) in CLUSTERCTL_NAMES.items():
            out += [flag[kind], f"{name}:{self.versions[p]}"]
        return out


def release_components(raw: str, image: str) -> str:
    """``raw`` (kustomize output) with every manager container's image set to
    ``image`` and pulled only if absent, as a release's components are."""
    docs = [d for d in yaml.safe_load_all(raw) if d]
    managers = 0
    for d in docs:
        if d.get("kind") != "Deployment":
            continue
        for c in d["spec"]["template"]["spec"].get("containers", []):
            if c.get("name") == "manager":
                c["image"], c["imagePullPolicy"] = image, "IfNotPresent"
                managers += 1
    if managers != 1:
        raise ValueError(f"expected one manager container in the components, found {managers}")
    return yaml.safe_dump_all(docs, sort_keys=False)


def build_repository(capi_dir: Path | None = None, images: dict[str, str] | None = None) -> Repository:
    capi_dir = capi_dir or capi_build.build_capi()
    images = images or capi_build.build_capi_images(capi_dir)
    versions = capi_build.provider_versions()
    templates = capi_build.module_dirs()[capi_build.TEST_MODULE] / CAPD_TEMPLATES
    key = digest("capi-repository-v1", sorted(images.items()), sorted(versions.items()),
                 *(capi_dir / "components" / f"{p}.yaml" for p in CLUSTERCTL_NAMES),
                 *sorted(templates.glob("*.yaml")))

    out = cache_dir() / "capi-repository" / key[:12]

    def build(tmp: Path) -> dict:
        providers = []
        for p, (name, kind, components) in CLUSTERCTL_NAMES.items():
            rel = Path(f"{TYPE_PREFIX[kind]}{name}") / versions[p]
            (tmp / rel).mkdir(parents=True)
            raw = (capi_dir / "components" / f"{p}.yaml").read_text()
            (tmp / rel / components).write_text(release_components(raw, images[p]))
            (tmp / rel / "metadata.yaml").write_bytes((capi_dir / "metadata" / f"{p}.yaml").read_bytes())
            if kind == "InfrastructureProvider":
                for t in sorted(templates.glob("*.yaml")):
                    (tmp / rel / t.name).write_bytes(t.read_bytes())
            # clusterctl reads the final location: produce() renames tmp to out
            providers.append({"name": name, "type": kind, "url": f"file://{out / rel / components}"})
        (tmp / "clusterctl.yaml").write_text(yaml.safe_dump({"providers": providers}, sort_keys=False))
        return {"versions": versions, "images": images}
    root = produce(out, build)
    return Repository(root, root / "clusterctl.yaml", versions)
