"""The harness installed from a wheel, not the checkout: ``pip install`` of
the built wheel into a fresh virtualenv (its dependencies from the package
index), then, from a directory outside the checkout and without PYTHONPATH,
``kube-harness build`` finds the Go modules in the installed package and the
cached artifacts, and ``pytest --pyargs suites.kubeadm`` collects the
installed suite. Real pip, real files; the builds are cached (ci/setup.sh)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSION = "v1.37.2"
pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _run(cmd: list[str], cwd: Path, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, dict]:
    """(the venv's bin dir, a directory outside the checkout, the environment)."""
    tmp = tmp_path_factory.mktemp("packaging")
    # a copy of the checkout: the wheel build writes build/ and *.egg-info next to the sources
    src = tmp / "src"
    skip = shutil.ignore_patterns(".git", "_artifacts", "__pycache__", "*.egg-info", ".pytest_cache")
    shutil.copytree(ROOT, src, ignore=lambda d, names: skip(d, names) | ({"build"} if Path(d) == ROOT else set()))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True)
    bindir = tmp / "venv" / "bin"
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    _run([str(bindir / "pip"), "wheel", "-q", "--no-deps", "-w", str(tmp / "wheel"), str(src)], tmp, env)
    wheels = list((tmp / "wheel").glob("kube_harness-*.whl"))
    assert len(wheels) == 1, wheels
    _run([str(bindir / "pip"), "install", "-q", str(wheels[0])], tmp, env)
    work = tmp / "elsewhere"
    work.mkdir()
    return bindir, work, env


def test_one_name_for_distribution_and_cli(installed):
    bindir, work, env = installed
    p = _run([str(bindir / "python"), "-c", "import importlib.metadata as m, harness; "
              "print(m.version('kube-harness')); print(harness.__file__)"], work, env)
    version, where = p.stdout.split()
    assert version == __import__("harness").__version__
    assert Path(where).is_relative_to(bindir.parent), f"harness imported from {where}, not the venv"
    assert (bindir / "kube-harness").is_file()


def test_build_help_and_go_modules_from_the_installed_package(installed):
    bindir, work, env = installed
    assert "--node-image" in _run([str(bindir / "kube-harness"), "build", "--help"], work, env).stdout
    p = _run([str(bindir / "python"), "-c", "from harness.build import cache; print(cache.SOURCES)"], work, env)
    sources = Path(p.stdout.strip())
    assert sources.is_relative_to(bindir.parent)
    for module in ("kube-build", "capi-build", "etcd-build", "coredns-build"):
        assert (sources / module / "go.mod").read_bytes() == \
            (ROOT / "harness/build/sources" / module / "go.mod").read_bytes()
        assert (sources / module / "go.sum").is_file()
    assert (sources / "busybox-sh" / "sh.c").is_file()
    p = _run([str(bindir / "python"), "-c", "from harness.kubeadm import cni; print(cni.FILES)"], work, env)
    cni_files = Path(p.stdout.strip())
    assert cni_files.is_relative_to(bindir.parent)
    for name in ("kh-cni-sync.sh", "kh-cni-agent.sh", "kh-cni.service"):
        assert (cni_files / name).read_bytes() == (ROOT / "harness/kubeadm/cni_files" / name).read_bytes()


def test_cached_build_from_the_installed_package(installed):
    """The installed package's build keys are the checkout's: everything is
    found in the cache (the same node image), in seconds."""
    bindir, work, env = installed
    checkout = _run([sys.executable, "-m", "harness.build", "--version", VERSION, "--node-image"], ROOT,
                    {**os.environ, "PYTHONPATH": str(ROOT)})
    t0 = time.monotonic()
    p = _run([str(bindir / "kube-harness"), "build", "--version", VERSION, "--node-image"], work, env)
    took = time.monotonic() - t0
    image = re.search(r"^node image: (\S+)$", p.stdout, re.M)
    assert image and image.group(0) in checkout.stdout.splitlines(), (p.stdout, checkout.stdout)
    assert took < 60, f"a cached build took {took:.0f}s:\n{p.stderr[-3000:]}"


def test_suite_collected_from_the_installed_package(installed):
    bindir, work, env = installed
    p = _run([str(bindir / "python"), "-m", "pytest", "--pyargs", "suites.kubeadm", "--collect-only", "-q",
              "-p", "no:cacheprovider"], work, env, timeout=300)
    tests = [line for line in p.stdout.splitlines() if "::" in line]
    assert any("test_nodes.py::" in line for line in tests), p.stdout[-3000:]
    assert re.search(r"^\d+ tests? collected", p.stdout, re.M), p.stdout[-3000:]
