"""The build layer's one helper module: the cache dir and completion
markers (:func:`produce`), content hashes, locks, the Go modules and sources
the builds read (shipped in the package, :func:`go_module`), commands with
streamed progress (:func:`run`), tarballs, and Docker image import and
lookups (:func:`docker_import`, :func:`image_id`, :func:`image_labels`).
Every build (harness/build/*, providers/docker/nodeimage) goes through it."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import tarfile
import threading
import time
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

from filelock import FileLock

log = logging.getLogger("harness.build")
ROOT = Path(__file__).resolve().parents[2]
#: the Go modules and C sources the builds read, shipped as package data
SOURCES = Path(__file__).resolve().parent / "sources"
INPUT_HASH_LABEL = "harness.k8s.io/input-hash"
DONE = ".complete"


class BuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    d = Path(os.environ.get("KUBE_HARNESS_CACHE") or Path.home() / ".cache" / "kube-harness")
    d.mkdir(parents=True, exist_ok=True)
    return d


def digest(*parts: object) -> str:
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, Path):
            p = p.read_bytes()
        h.update(p if isinstance(p, bytes) else json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    key = f"{path}\0{size}\0{mtime_ns}"
    known = _digests().get(key)
    if known:
        return known
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    _remember(key, h.hexdigest())
    return h.hexdigest()


def file_digest(path: Path) -> str:
    """sha256 of a file's content, memoized per path, size and mtime (in the
    process and in the cache dir, so a cached build does not hash its binaries
    again): images built from the same binaries, wherever they came from, are
    cache hits."""
    st = path.stat()
    return _file_digest(str(path), st.st_size, st.st_mtime_ns)


def _digests_file() -> Path:
    return cache_dir() / "file-digests.json"


@functools.lru_cache(maxsize=1)
def _digests() -> dict[str, str]:
    try:
        return dict(json.loads(_digests_file().read_text()))
    except (OSError, ValueError, TypeError):
        return {}


def _remember(key: str, value: str) -> None:
    """Add one digest to the file (atomic replace; a lost concurrent update only costs a rehash)."""
    path = _digests_file()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    with _DIGESTS_LOCK:
        known = _digests()
        known[key] = value
        text = json.dumps(known)
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)


_DIGESTS_LOCK = threading.Lock()


@contextlib.contextmanager
def lock(name: str, timeout: float = 7200) -> Iterator[None]:
    d = cache_dir() / "locks"
    d.mkdir(exist_ok=True)
    with FileLock(str(d / f"{name}.lock"), timeout=timeout):
        yield


def is_complete(d: Path) -> bool:
    return (d / DONE).exists()


def mark_complete(d: Path, info: dict) -> None:
    (d / DONE).write_text(json.dumps({**info, "completed": time.time()}, indent=2))


def produce(out: Path, build: Callable[[Path], dict], force: bool = False) -> Path:
    """The cached output directory ``out``: when not complete yet,
    ``build(tmp)`` fills a temporary sibling under a lock and returns the
    info for the completion marker; the directory is renamed into place and
    marked complete last, so a half-made build is never taken. ``force``
    builds again even when complete."""
    if is_complete(out) and not force:
        return out
    with lock(f"{out.parent.name}-{out.name}"):
        if is_complete(out) and not force:
            return out
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            info = build(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        mark_complete(out, info)
    return out


def produce_file(out: Path, make: Callable[[Path], None], force: bool = False) -> Path:
    """The cached file ``out``: unless it exists, ``make(tmp)`` writes a
    temporary sibling under a lock, renamed into place when done."""
    if out.exists() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with lock(f"{out.parent.name}-{out.name}"):
        if out.exists() and not force:
            return out
        tmp = out.with_name(out.name + ".tmp")
        try:
            make(tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        tmp.rename(out)
    return out


def source(name: str) -> Path:
    """A Go module or source file the builds read (``harness/build/sources/<name>``),
    where the package is: a checkout or an installed copy, which may be read-only."""
    p = SOURCES / name
    if not p.exists():
        raise BuildError(f"{p}: missing from the kube-harness package (package data not installed?)")
    return p


def go_module(name: str) -> Path:
    """The packaged Go module ``name`` copied into the cache
    (``modules/<name>-<hash12>``, keyed by its files' content), where ``go``
    may run and write: the package may be read-only or shared."""
    src = source(name)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    key = digest("go-module-v1", *[(str(p.relative_to(src)), file_digest(p)) for p in files])

    def copy(tmp: Path) -> dict:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        return {"source": str(src)}
    return produce(cache_dir() / "modules" / f"{name}-{key[:12]}", copy)


def run(cmd: list[str], *, cwd: Path | None = None, env: dict | None = None, what: str = "",
        timeout: float | None = None, heartbeat: float = 30, stderr: bool = True,
        on_line: Callable[[str], None] | None = None, log_file: Path | None = None, stdin: IO | None = None) -> str:
    """Run a command and return its output; its lines are logged at debug
    (and written to ``log_file``, and passed to ``on_line``) as they come,
    and while it runs (silent ones like go build too) a heartbeat is logged
    at info every ``heartbeat`` seconds. ``stderr=False`` keeps stderr out
    of the returned output (for JSON on stdout). Raises BuildError with the
    output tail on failure or timeout. ``stdin``: a file to read from."""
    log.debug("run: " + " ".join(cmd), extra={"phase": what})
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT if stderr else subprocess.PIPE, text=True, errors="replace")
    out: list[str] = []
    err: list[str] = []
    lf = open(log_file, "w") if log_file else None

    def reader(stream, lines: list[str], callback: bool) -> None:
        for line in stream:
            lines.append(line)
            if lf:
                lf.write(line)
            log.debug(line.rstrip(), extra={"phase": what})
            if callback and on_line:
                on_line(line.rstrip())

    threads = [threading.Thread(target=reader, args=(p.stdout, out, True), daemon=True)]
    if not stderr:
        threads.append(threading.Thread(target=reader, args=(p.stderr, err, False), daemon=True))
    for t in threads:
        t.start()
    try:
        while True:
            try:
                rc = p.wait(timeout=heartbeat)
                break
            except subprocess.TimeoutExpired:
                el = time.monotonic() - t0
                if timeout and el > timeout:
                    p.kill()
                    p.wait()
                    raise BuildError(f"{what or cmd[0]}: timed out after {timeout:.0f}s:\n"
                                     f"{''.join(err + out)[-4000:]}")
                log.info(f"still running ({el:.0f}s){': ' + out[-1].strip()[:160] if out else ''}",
                         extra={"phase": what, "elapsed": round(el)})
        for t in threads:
            t.join(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
        if lf:
            lf.close()
    if rc != 0:
        tail = "".join(err or out)[-4000:]
        raise BuildError(f"{what or ' '.join(cmd[:6])} failed (exit {rc}){f'; log {log_file}' if log_file else ''}:"
                         f"\n{tail}")
    return "".join(out)


def tar_add(tf: tarfile.TarFile, name: str, *, data: bytes | None = None, mode: int = 0o644,
            link: str | None = None, dir: bool = False) -> None:
    ti = tarfile.TarInfo(name)
    ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "root", "root"
    if dir:
        ti.type, ti.mode = tarfile.DIRTYPE, mode
        tf.addfile(ti)
    elif link is not None:
        ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, link, 0o777
        tf.addfile(ti)
    else:
        ti.size, ti.mode = len(data or b""), mode
        tf.addfile(ti, io.BytesIO(data or b""))


def image_inspect(tag: str, fmt: str) -> str | None:
    """``docker image inspect --format fmt tag``, or None when there is no such image."""
    p = subprocess.run(["docker", "image", "inspect", "--format", fmt, tag], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else None


def image_labels(tag: str) -> dict[str, str] | None:
    out = image_inspect(tag, "{{json .Config.Labels}}")
    return None if out is None else json.loads(out or "null") or {}


def image_config(tag: str) -> dict:
    out = image_inspect(tag, "{{json .Config}}")
    if out is None:
        raise BuildError(f"image {tag} not found")
    return json.loads(out)


def image_hash(tag: str) -> str | None:
    """The image's input-hash label: None without the image, "" without the label."""
    labels = image_labels(tag)
    return None if labels is None else labels.get(INPUT_HASH_LABEL, "")


def image_fresh(tag: str, h: str) -> bool:
    return image_hash(tag) == h


def image_id(tag: str) -> str | None:
    return image_inspect(tag, "{{.Id}}") or None


def image_tags(repository: str) -> list[str]:
    """The local ``repository:tag`` names of a repository."""
    return run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", repository],
               what=f"docker images {repository}").split()


@contextlib.contextmanager
def replacing(tag: str) -> Iterator[None]:
    """Around a rebuild of ``tag``: remove the image it named before, unless
    something still uses it (docker refuses then), so rebuilds leave no
    dangling images behind."""
    old = image_id(tag)
    yield
    if old and old != image_id(tag):
        subprocess.run(["docker", "image", "rm", old], capture_output=True)


def docker_import(tar: Path, tag: str, h: str | None, changes: Iterable[str] = (),
                  labels: dict[str, str] | None = None) -> None:
    """``docker import`` a rootfs tarball as ``tag`` with Dockerfile ``changes``,
    labelled with the input hash ``h`` (unless None) and ``labels``."""
    cmd = ["docker", "import"]
    if h is not None:
        cmd += ["--change", f"LABEL {INPUT_HASH_LABEL}={h}"]
    for c in changes:
        cmd += ["--change", c]
    for k, v in (labels or {}).items():
        cmd += ["--change", f"LABEL {k}={json.dumps(v)}"]
    with replacing(tag):
        run(cmd + [str(tar), tag], what=f"import {tag}", timeout=1800)


def docker_build(tag: str, context: Path, labels: dict[str, str] | None = None) -> None:
    """``docker build`` of ``context`` with the classic builder (FROM a local
    image never pulls), replacing what ``tag`` named before."""
    cmd = ["docker", "build", "--pull=false", "-q", "-t", tag]
    for k, v in (labels or {}).items():
        cmd += ["--label", f"{k}={v}"]
    with replacing(tag):
        run(cmd + [str(context)], env={**os.environ, "DOCKER_BUILDKIT": "0"}, what=f"build {tag}", timeout=1800)
