"""The node *base* image, built locally from Debian packages.

There is no container registry here, so instead of ``FROM debian`` the
rootfs is bootstrapped with ``mmdebstrap`` (bookworm, this machine's apt
sources), configured like kind's base image (``files/`` is copied over the
rootfs, then ``customize.sh`` runs in it) and ``docker import``-ed with the
image config a systemd node container needs.

The result is tagged ``kube-harness/base:<hash12>`` where the hash covers
everything that goes into the build: suite, variant, package list, apt and
dpkg options, the sandbox image, every file under ``files/``,
``customize.sh`` and :data:`BUILD_VERSION`. If that tag exists, building is
a no-op. The rootfs tarball is cached under ``$KUBE_HARNESS_CACHE/base/``
(default ``~/.cache/kube-harness/base/``), so a lost image is re-imported in
seconds; downloaded .debs are kept there too so that a changed recipe does
not download everything again.

The container runtime is not Debian's: containerd 2, runc and the CNI
plugins are built from the Go module proxy at pinned versions
(:mod:`harness.build.runtime`) and copied into the rootfs; their content is
part of the hash. The image contains no Kubernetes binaries: a node image
build adds ``/usr/bin/kubelet``, ``kubeadm``, ``kubectl`` and ``crictl`` on
top and preloads images into containerd. Note that the image declares
``VOLUME /var``: content a derived image wants under ``/var`` must be in the
imported/copied filesystem, not written by ``RUN`` steps after the VOLUME.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

from harness.build.cache import (BuildError, cache_dir, docker_build, docker_import, file_digest, image_id,
                                 image_inspect, lock, run)

log = logging.getLogger("harness.nodeimage")

#: bump to force a rebuild when the build logic (not its inputs) changes
BUILD_VERSION = "2"  # 2: containerd 2 / runc / CNI plugins built from Go modules
REPOSITORY = "kube-harness/base"
SUITE = "bookworm"
VARIANT = "minbase"
#: sandbox (pause) image written into containerd's config.toml; a node image
#: build may change it with ``/usr/local/bin/kh-sandbox-image.sh <image>``
# (pause 3.10.2 is what kubeadm v1.37, the harness's default version, expects)
DEFAULT_SANDBOX_IMAGE = "registry.k8s.io/pause:3.10.2"

PACKAGES: tuple[str, ...] = (
    # init system inside the container
    "systemd", "systemd-sysv", "dbus",
    # what the container runtime (built from Go modules, see runtime_files) uses
    "libseccomp2", "pigz",
    # what kubeadm preflight and the kubelet exec on the node
    "iptables", "conntrack", "ebtables", "ethtool", "socat", "iproute2", "kmod",
    "util-linux", "mount", "procps", "netbase", "hostname", "ca-certificates", "bash", "coreutils",
    # API load balancer container (run by hand, never as a node unit)
    "haproxy",
    # debugging and health checks from inside a node
    "curl", "iputils-ping",
)

APT_OPTIONS: tuple[str, ...] = (
    'Apt::Install-Recommends "false"',
    # this machine's (snapshot) mirror serves Release files past Valid-Until
    'Acquire::Check-Valid-Until "false"',
    'Acquire::Check-Date "false"',
    'Acquire::Languages "none"',
)
DPKG_OPTIONS: tuple[str, ...] = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/lintian/*",
)

HERE = Path(__file__).resolve().parent
FILES_DIR = HERE / "files"
CUSTOMIZE = HERE / "customize.sh"

ENTRYPOINT = ["/usr/local/bin/entrypoint.sh", "/sbin/init"]


def import_changes(volume_var: bool = True) -> list[str]:
    """Dockerfile instructions applied at ``docker import``."""
    ch = [
        'ENTRYPOINT ["/usr/local/bin/entrypoint.sh"]',
        'CMD ["/sbin/init"]',
        "ENV container=docker",
    ]
    if volume_var:
        ch.append("VOLUME /var")
    return ch


#: set in a metadata-only build step: Docker 20.10's import rejects STOPSIGNAL
#: (systemd halts cleanly on SIGRTMIN+3; SIGTERM would make it re-execute)
STOP_SIGNAL = "SIGRTMIN+3"


def base_cache_dir() -> Path:
    return cache_dir() / "base"


def apt_sources() -> list[Path]:
    """This machine's apt sources (deb822 ``.sources`` and one-line ``.list``)."""
    out = [Path(p) for p in sorted(glob.glob("/etc/apt/sources.list.d/*.sources"))
           + sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]
    if Path("/etc/apt/sources.list").is_file() and Path("/etc/apt/sources.list").read_text().strip():
        out.insert(0, Path("/etc/apt/sources.list"))
    return [p for p in out if p.read_text().strip()]


def runtime_files() -> dict[str, Path]:
    """rootfs path -> built binary: containerd, ctr, the runc shim, runc
    (/usr/local/bin) and the CNI plugins (/opt/cni/bin)."""
    from harness.build import runtime
    dirs = runtime.build_runtime()
    files = {f"usr/local/bin/{b}": dirs["containerd"] / "bin" / b
             for b in ("containerd", "ctr", "containerd-shim-runc-v2")}
    files["usr/local/bin/runc"] = dirs["runc"] / "bin" / "runc"
    for p in sorted((dirs["cni-plugins"] / "bin").iterdir()):
        files[f"opt/cni/bin/{p.name}"] = p
    return files


def _iter_files(root: Path) -> Iterable[Path]:
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            yield p


def _hasher():
    h = hashlib.sha256()

    def add(tag: str, data: bytes | str) -> None:
        b = data.encode() if isinstance(data, str) else data
        h.update(f"{tag}:{len(b)}:".encode())
        h.update(b)
    return h, add


def rootfs_hash(sandbox_image: str = DEFAULT_SANDBOX_IMAGE, runtime: dict[str, Path] | None = None) -> str:
    """sha256 over what goes into the rootfs tarball (hex)."""
    h, add = _hasher()
    for dest, src in sorted((runtime if runtime is not None else runtime_files()).items()):
        add("runtime", f"{dest}={file_digest(src)}")
    add("version", BUILD_VERSION)
    add("suite", SUITE)
    add("variant", VARIANT)
    add("packages", "\n".join(PACKAGES))
    add("apt", "\n".join(APT_OPTIONS))
    add("dpkg", "\n".join(DPKG_OPTIONS))
    add("sandbox", sandbox_image)
    add("customize", CUSTOMIZE.read_bytes())
    for p in _iter_files(FILES_DIR):
        add("file", str(p.relative_to(FILES_DIR)))
        add("data", p.read_bytes())
    return h.hexdigest()


def content_hash(sandbox_image: str = DEFAULT_SANDBOX_IMAGE, volume_var: bool = True,
                 runtime: dict[str, Path] | None = None) -> str:
    """sha256 over every build input: the rootfs and the image config (hex)."""
    h, add = _hasher()
    add("rootfs", rootfs_hash(sandbox_image, runtime))
    add("changes", "\n".join(import_changes(volume_var)))
    add("stopsignal", STOP_SIGNAL)
    return h.hexdigest()


def image_tag(sandbox_image: str = DEFAULT_SANDBOX_IMAGE, volume_var: bool = True,
              runtime: dict[str, Path] | None = None) -> str:
    return f"{REPOSITORY}:{content_hash(sandbox_image, volume_var, runtime)[:12]}"


class _Progress:
    """Phase logging with elapsed times (to the ``harness`` loggers, which
    write to stderr), plus an optional ``progress(phase, message)`` callback."""

    def __init__(self, cb: Callable[[str, str], None] | None):
        self.cb = cb
        self.t0 = time.monotonic()
        self.phase = "start"
        self.phase_t0 = self.t0
        _ensure_stderr_logging()

    def __call__(self, phase: str, msg: str, level: int = logging.INFO) -> None:
        if phase != self.phase:
            self.phase, self.phase_t0 = phase, time.monotonic()
        elapsed = time.monotonic() - self.t0
        log.log(level, f"base image: {msg} ({elapsed:.1f}s)",
                extra={"phase": f"base-image:{phase}", "elapsed": round(elapsed, 1)})
        if self.cb is not None:
            try:
                self.cb(phase, msg)
            except Exception:  # a broken callback must not break the build
                log.debug("progress callback failed", exc_info=True)


def _ensure_stderr_logging() -> None:
    """Make INFO progress visible on stderr when nobody configured logging."""
    lg: logging.Logger | None = log
    while lg is not None:
        if lg.handlers:
            return
        lg = lg.parent if lg.propagate else None
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("kube-harness %(message)s"))
    log.addHandler(h)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)


def mmdebstrap_command(rootfs_tar: Path, sandbox_image: str, debs: Path | None = None,
                       mode: str = "root", runtime_dir: Path | None = None) -> list[str]:
    """The mmdebstrap invocation that produces ``rootfs_tar``."""
    cmd = ["mmdebstrap", f"--mode={mode}", f"--variant={VARIANT}", "--format=tar",
           "--include=" + ",".join(PACKAGES)]
    cmd += [f"--aptopt={o}" for o in APT_OPTIONS]
    cmd += [f"--dpkgopt={o}" for o in DPKG_OPTIONS]
    if debs is not None:
        # reuse .debs downloaded by earlier builds
        cmd += ['--setup-hook=mkdir -p "$1"/var/cache/apt/archives/',
                f"--setup-hook=sync-in {shlex.quote(str(debs))} /var/cache/apt/archives/"]
    cmd += [f"--customize-hook=sync-in {shlex.quote(str(FILES_DIR))} /"]
    if runtime_dir is not None:
        cmd += [f"--customize-hook=sync-in {shlex.quote(str(runtime_dir))} /"]
    cmd += [
            f"--customize-hook=upload {shlex.quote(str(CUSTOMIZE))} /tmp/kh-customize.sh",
            f'--customize-hook=chroot "$1" /bin/sh /tmp/kh-customize.sh {shlex.quote(sandbox_image)}',
            '--customize-hook=rm -f "$1"/tmp/kh-customize.sh']
    if debs is not None:
        cmd += [f"--customize-hook=sync-out /var/cache/apt/archives {shlex.quote(str(debs))}"]
    cmd += [SUITE, str(rootfs_tar)]
    cmd += [str(p) for p in apt_sources()]
    return cmd


def _run_logged(cmd: list[str], progress: _Progress, phase: str, cwd: Path, env: dict[str, str],
                logfile: Path) -> None:
    """Run cmd, its full output in logfile, reporting mmdebstrap's steps ("I: ...")."""
    progress(phase, f"running {cmd[0]} (log: {logfile})")

    def step(line: str) -> None:
        if line.startswith("I: ") and not line.startswith("I: running --"):
            progress(phase, line[3:][:200])
    try:
        run(cmd, cwd=cwd, env=env, what=f"base-image:{phase}", on_line=step, log_file=logfile)
    except BuildError as e:
        raise BaseImageError(str(e)) from None


class BaseImageError(BuildError):
    pass


def build_base_image(force: bool = False, progress: Callable[[str, str], None] | None = None, *,
                     sandbox_image: str = DEFAULT_SANDBOX_IMAGE, volume_var: bool = True,
                     runtime: dict[str, Path] | None = None) -> str:
    """Build (or find) the node base image; returns its tag
    ``kube-harness/base:<hash12>``.

    ``force`` rebuilds the rootfs even if the tag or the cached tarball
    exists. ``runtime`` (rootfs path -> file) defaults to :func:`runtime_files`. ``progress(phase, message)`` is called for every progress line
    (they are logged to the ``harness.nodeimage`` logger in any case).
    Safe to call from several processes at once (a file lock serialises
    builds of the same hash).
    """
    runtime = runtime if runtime is not None else runtime_files()
    digest = content_hash(sandbox_image, volume_var, runtime)
    tag = f"{REPOSITORY}:{digest[:12]}"
    if not force and image_id(tag):
        log.debug(f"base image {tag} exists")
        return tag
    pr = _Progress(progress)
    cache = base_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    pr("lock", f"waiting for the build lock base-{digest[:12]}")
    with lock(f"base-{digest[:12]}"):
        if not force and image_id(tag):  # another process built it meanwhile
            pr("done", f"{tag} was built by another process")
            return tag
        tarball = cache / f"rootfs-{rootfs_hash(sandbox_image, runtime)[:12]}.tar"
        if force or not tarball.is_file():
            _build_rootfs(tarball, sandbox_image, runtime, pr)
        else:
            pr("rootfs", f"using cached rootfs {tarball} ({tarball.stat().st_size / 2**20:.0f} MiB)")
        _import(tarball, tag, digest, volume_var, pr)
        _prune_cache(cache, keep=tarball)
        pr("done", f"built {tag}")
        return tag


def _stage(runtime: dict[str, Path], into: Path) -> Path:
    """The runtime files laid out as in the rootfs, for mmdebstrap's sync-in."""
    for dest, src in runtime.items():
        p = into / dest
        p.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, p)
        os.chmod(p, 0o755)
    return into


def _build_rootfs(tarball: Path, sandbox_image: str, runtime: dict[str, Path], pr: _Progress) -> None:
    if shutil.which("mmdebstrap") is None:
        raise BaseImageError("mmdebstrap is not installed (apt-get install mmdebstrap)")
    if not apt_sources():
        raise BaseImageError("no apt sources found in /etc/apt/sources.list(.d)")
    cache = tarball.parent
    debs = cache / "debs"
    debs.mkdir(exist_ok=True)
    # on disk (the cache's filesystem), not a tmpfs: the rootfs is ~0.5 GiB
    work = Path(tempfile.mkdtemp(prefix="build-", dir=cache))
    try:
        out = work / "rootfs.tar"
        env = {**os.environ, "TMPDIR": str(work), "LC_ALL": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
        mode = "root" if os.geteuid() == 0 else "unshare"
        cmd = mmdebstrap_command(out, sandbox_image, debs, mode, _stage(runtime, work / "runtime"))
        pr("rootfs", f"mmdebstrap {SUITE} ({VARIANT}, {len(PACKAGES)} packages, mode {mode}) into {work}")
        _run_logged(cmd, pr, "rootfs", work, env, cache / f"mmdebstrap-{tarball.stem.split('-')[-1]}.log")
        os.replace(out, tarball)  # same filesystem: atomic
        pr("rootfs", f"rootfs {tarball} ({tarball.stat().st_size / 2**20:.0f} MiB)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _import(tarball: Path, tag: str, digest: str, volume_var: bool, pr: _Progress) -> None:
    """docker import the rootfs, then a metadata-only build on top of it for
    what import cannot set (STOPSIGNAL) and the labels."""
    rootfs_tag = f"{REPOSITORY}-rootfs:{digest[:12]}"
    pr("import", f"docker import {tarball.name} as {rootfs_tag}")
    docker_import(tarball, rootfs_tag, None, import_changes(volume_var))
    pr("import", f"setting STOPSIGNAL {STOP_SIGNAL} and labels: {tag}")
    with tempfile.TemporaryDirectory(prefix="kh-base-") as d:
        (Path(d) / "Dockerfile").write_text(f"FROM {rootfs_tag}\nSTOPSIGNAL {STOP_SIGNAL}\n")
        docker_build(tag, Path(d), {"harness.k8s.io/image": "base", "harness.k8s.io/content-hash": digest})
    with contextlib.suppress(BuildError):  # untag only: it is the parent layer
        run(["docker", "image", "rm", "--no-prune", rootfs_tag], what=f"untag {rootfs_tag}")
    size = image_inspect(tag, "{{.Size}}")
    if size is None:
        raise BaseImageError(f"import finished but {tag} does not exist")
    pr("import", f"{tag} = {(image_id(tag) or '')[:19]} ({int(size) / 2**20:.0f} MiB)")


def _prune_cache(cache: Path, keep: Path, max_tarballs: int = 2) -> None:
    """Keep the newest few rootfs tarballs (and drop stale lock files)."""
    tars = sorted(cache.glob("rootfs-*.tar"), key=lambda p: p.stat().st_mtime, reverse=True)
    for p in tars[max_tarballs:]:
        if p != keep:
            with contextlib.suppress(OSError):
                p.unlink()
    day = time.time() - 86400
    for p in [*cache.glob("build-*.lock"), *cache.glob("mmdebstrap-*.log")]:
        with contextlib.suppress(OSError):
            if p.stat().st_mtime < day:
                p.unlink()


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description="build the kube-harness node base image")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--sandbox-image", default=DEFAULT_SANDBOX_IMAGE)
    ap.add_argument("--print-hash", action="store_true", help="print the tag the inputs hash to and exit")
    a = ap.parse_args(argv)
    if a.print_hash:
        print(image_tag(a.sandbox_image))
        return 0
    logging.basicConfig(level=logging.INFO, format="kube-harness %(message)s", stream=sys.stderr)
    print(build_base_image(force=a.force, sandbox_image=a.sandbox_image))
    return 0


if __name__ == "__main__":
    sys.exit(main())
