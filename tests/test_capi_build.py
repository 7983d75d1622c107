"""The real upstream Cluster API controllers built from the Go module proxy
(ci/capi-build): static binaries reporting their release, the providers'
config/default rendered by kustomize, cache hits, and the managers' images.
ci/setup.sh --all builds them first (minutes cold); here they come from the
cache."""
from __future__ import annotations

import json
import subprocess

import docker
import pytest
import yaml

from harness.build import capi
from harness.build.cache import DONE
from harness.build.runtime import is_static

pytestmark = [pytest.mark.docker, pytest.mark.slow]
CORE, CAPD, KUSTOMIZE = "v1.13.6", "v1.13.7", "v5.8.2"
MANAGERS = {"capi-manager": CORE, "capi-kubeadm-bootstrap-manager": CORE,
            "capi-kubeadm-control-plane-manager": CORE, "capd-manager": CAPD}
# provider -> (objects, CRDs) of `kustomize build config/default`
COMPONENTS = {"core": (26, 13), "bootstrap-kubeadm": (14, 2), "control-plane-kubeadm": (15, 2),
              "infrastructure-docker": (24, 12)}


@pytest.fixture(scope="module")
def built():
    return capi.build_capi()


def output(*cmd, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)


def test_pinned_versions():
    assert capi.pinned_versions() == {capi.CORE_MODULE: CORE, capi.TEST_MODULE: CAPD, capi.KUSTOMIZE_MODULE: KUSTOMIZE}
    assert capi.provider_versions() == {"core": CORE, "bootstrap-kubeadm": CORE, "control-plane-kubeadm": CORE,
                                        "infrastructure-docker": CAPD}


def test_binaries_are_static(built):
    assert sorted(p.name for p in (built / "bin").iterdir()) == sorted([*MANAGERS, "clusterctl", "kustomize"])
    for b in (built / "bin").iterdir():
        assert is_static(b), b
        assert "not a dynamic executable" in (lambda p: p.stdout + p.stderr)(output("ldd", b)), b


def test_clusterctl_and_kustomize_versions(built):
    assert output(built / "bin" / "clusterctl", "version", "-o", "short").stdout.strip() == CORE
    info = json.loads(output(built / "bin" / "clusterctl", "version", "-o", "json").stdout)
    assert info["clusterctl"]["gitVersion"] == CORE and info["clusterctl"]["major"] == "1"
    assert output(built / "bin" / "kustomize", "version").stdout.strip() == KUSTOMIZE


@pytest.mark.parametrize("manager", sorted(MANAGERS))
def test_manager_reports_its_version(built, manager, tmp_path):
    """The managers have no --version: they log their version first thing,
    then fail on the missing kubeconfig. --help exits 0."""
    b = built / "bin" / manager
    p = output(b, f"--kubeconfig={tmp_path / 'missing'}")
    assert p.returncode != 0
    assert f"Version: {MANAGERS[manager]} (git commit: {'0' * 40})" in p.stdout + p.stderr
    h = output(b, "--help")
    assert h.returncode == 0 and "--leader-elect" in h.stdout + h.stderr


@pytest.mark.parametrize("provider", sorted(COMPONENTS))
def test_components_are_raw_kustomize_output(built, provider):
    text = (built / "components" / f"{provider}.yaml").read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    objects, crds = COMPONENTS[provider]
    assert len(docs) == objects
    assert sum(d["kind"] == "CustomResourceDefinition" for d in docs) == crds
    assert "${" in text  # variables are left for clusterctl-style substitution
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Certificate", "Issuer"} <= kinds  # cert-manager objects as upstream ships them
    image = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert "k8s-staging-cluster-api" in image  # placeholder image, untouched


def test_metadata_per_provider(built):
    for provider in COMPONENTS:
        meta = yaml.safe_load((built / "metadata" / f"{provider}.yaml").read_text())
        assert meta["kind"] == "Metadata"
        assert {"major": 1, "minor": 13, "contract": "v1beta2"} in meta["releaseSeries"]


def test_second_build_is_a_cache_hit(built):
    files = [built, built / DONE, *sorted(p for p in built.rglob("*") if p.is_file())]
    before = [(p, p.stat().st_mtime_ns) for p in files]
    marker = (built / DONE).read_text()
    assert capi.build_capi() == built
    assert [(p, p.stat().st_mtime_ns) for p in files] == before
    assert (built / DONE).read_text() == marker
    info = json.loads(marker)
    assert info["versions"][capi.CORE_MODULE] == CORE and set(info["sha256"]) == {*MANAGERS, "clusterctl", "kustomize"}


def test_manager_images_run(built):
    dk = docker.from_env()
    tags = capi.build_capi_images(built)
    assert tags == {"core": f"registry.k8s.io/cluster-api/cluster-api-controller:{CORE}",
                    "bootstrap-kubeadm": f"registry.k8s.io/cluster-api/kubeadm-bootstrap-controller:{CORE}",
                    "control-plane-kubeadm": f"registry.k8s.io/cluster-api/kubeadm-control-plane-controller:{CORE}",
                    "infrastructure-docker": f"registry.k8s.io/cluster-api/capd-manager:{CAPD}"}
    ids = {t: dk.images.get(t).id for t in tags.values()}
    assert capi.build_capi_images(built) == tags and {t: dk.images.get(t).id for t in tags.values()} == ids  # cached
    for provider, tag in tags.items():
        img = dk.images.get(tag)
        assert img.attrs["Config"]["Entrypoint"] == ["/manager"]
        assert img.attrs["Config"]["User"] == ("" if provider == "infrastructure-docker" else "65532:65532")
        assert "--leader-elect" in dk.containers.run(tag, ["--help"], remove=True, stderr=True).decode()
        out = subprocess.run(["docker", "run", "--rm", tag, "--kubeconfig=/missing"], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode != 0 and f"Version: {tag.rsplit(':', 1)[1]}" in out.stdout + out.stderr
