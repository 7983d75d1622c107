"""The Docker engine ci/engine.sh provides: >= 23, so that --privileged node
containers get the host's bounding set instead of failing to start."""
from __future__ import annotations

import shutil
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parent.parent
CAPBND_C = r"""
#include <stdio.h>
#include <string.h>
int main(void) {
  char l[256];
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return 1;
  while (fgets(l, sizeof l, f)) if (!strncmp(l, "CapBnd:", 7)) fputs(l, stdout);
  return 0;
}
"""


def docker(*args: str, timeout: int = 120) -> str:
    p = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"docker {' '.join(args)}: {p.stderr}"
    return p.stdout.strip()


def capbnd(status: str) -> str:
    return next(l.split()[1] for l in status.splitlines() if l.startswith("CapBnd:"))


@pytest.fixture(scope="module")
def server_version() -> str:
    if not shutil.which("docker"):
        pytest.skip("no docker CLI")
    p = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"no Docker engine: {p.stderr.strip()}")
    return p.stdout.strip()


@pytest.fixture(scope="module")
def capbnd_image(server_version, tmp_path_factory) -> str:
    """A one-file image (a static binary printing its CapBnd), made with docker import."""
    d = tmp_path_factory.mktemp("capbnd")
    (d / "capbnd.c").write_text(CAPBND_C)
    cc = subprocess.run(["gcc", "-static", "-Os", "-o", str(d / "capbnd"), str(d / "capbnd.c")],
                        capture_output=True, text=True)
    if cc.returncode != 0:
        pytest.skip(f"cannot build a static binary: {cc.stderr.strip()}")
    with tarfile.open(d / "rootfs.tar", "w") as t:
        t.add(d / "capbnd", arcname="capbnd")
    tag = f"kube-harness-capbnd:{uuid.uuid4().hex[:8]}"
    docker("import", str(d / "rootfs.tar"), tag)
    yield tag
    docker("rmi", tag)


def test_engine_is_23_or_newer(server_version):
    assert int(server_version.split(".")[0]) >= 23, server_version


def test_privileged_container_gets_host_bounding_set(capbnd_image):
    host = capbnd(Path("/proc/self/status").read_text())
    out = docker("run", "--rm", "--privileged", "--network=none", capbnd_image, "/capbnd")
    assert capbnd(out) == host


def test_engine_sh_second_run_leaves_engine_alone(server_version):
    start = time.monotonic()
    p = subprocess.run(["bash", str(ROOT / "ci" / "engine.sh")], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    assert p.returncode == 0, p.stderr
    assert "left alone" in p.stderr, p.stderr
    assert took < 10, f"second run took {took:.1f}s"
