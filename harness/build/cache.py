"""Shared build plumbing: the cache dir, content hashes, locks, commands
with streamed progress, tarballs and docker import."""
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
from typing import Callable, Iterable, Iterator

from filelock import FileLock

log = logging.getLogger("harness.build")
ROOT = Path(__file__).resolve().parents[2]
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


def run(cmd: list[str], *, cwd: Path | None = None, env: dict | None = None, what: str = "",
        timeout: float | None = None, heartbeat: float = 30) -> str:
    """Run a command, logging its output lines at debug and, while it runs
    (silent ones like go build too), a heartbeat at info every ``heartbeat``
    seconds; raise BuildError with the output tail on failure or timeout."""
    log.debug("run: " + " ".join(cmd), extra={"phase": what})
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []

    def reader() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            out.append(line)
            log.debug(line.rstrip(), extra={"phase": what})

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    while True:
        try:
            rc = p.wait(timeout=heartbeat)
            break
        except subprocess.TimeoutExpired:
            el = time.monotonic() - t0
            if timeout and el > timeout:
                p.kill()
                p.wait()
                raise BuildError(f"{what or cmd[0]}: timed out after {timeout:.0f}s:\n{''.join(out)[-4000:]}")
            log.info(f"still running ({el:.0f}s)", extra={"phase": what, "elapsed": round(el)})
    t.join(timeout=10)
    if rc != 0:
        raise BuildError(f"{what or ' '.join(cmd[:4])} failed (exit {rc}):\n{''.join(out)[-4000:]}")
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


def image_labels(tag: str) -> dict[str, str] | None:
    p = subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", tag],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout.strip() or "null") or {}


def image_fresh(tag: str, h: str) -> bool:
    labels = image_labels(tag)
    return labels is not None and labels.get(INPUT_HASH_LABEL) == h


def image_id(tag: str) -> str | None:
    p = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True)
    return p.stdout.strip() or None if p.returncode == 0 else None


@contextlib.contextmanager
def replacing(tag: str) -> Iterator[None]:
    """Around a rebuild of ``tag``: remove the image it named before, unless
    something still uses it (docker refuses then), so rebuilds leave no
    dangling images behind."""
    old = image_id(tag)
    yield
    if old and old != image_id(tag):
        subprocess.run(["docker", "image", "rm", old], capture_output=True)


def docker_import(tar: Path, tag: str, h: str, changes: Iterable[str] = ()) -> None:
    cmd = ["docker", "import", "--change", f"LABEL {INPUT_HASH_LABEL}={h}"]
    for c in changes:
        cmd += ["--change", c]
    with replacing(tag):
        run(cmd + [str(tar), tag], what=f"import {tag}")
