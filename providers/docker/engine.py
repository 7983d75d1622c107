"""The Docker engine as the provider talks to it: the docker-py client, a lost
engine as :class:`EngineUnavailable`, why a machine stopped (an engine restart),
exec (streamed over the hijacked connection, :mod:`.exec_stream`), file copies
and container logs."""
from __future__ import annotations

import functools
import io
import logging
import os
import signal
import tarfile
import time
from datetime import datetime
from pathlib import Path
from typing import Mapping, Sequence

import docker
import psutil
import requests
from docker import errors as derr

from providers.base import ExecError, ExecResult, Machine, ProviderError

from .exec_stream import hijack, read_stream

log = logging.getLogger("harness.provider.docker")


class EngineUnavailable(ProviderError):
    """The Docker engine does not answer."""


def engine_guarded(method):
    """A method of the :class:`Engine` (or of an object with an ``engine``) whose lost
    engine connection is an :class:`EngineUnavailable`."""
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (requests.exceptions.ConnectionError, ConnectionError) as e:
            what = method.__name__.lstrip("_")
            if args and isinstance(args[0], Machine):  # "<machine>: exec <command>"
                cmd = args[1] if len(args) > 1 and isinstance(args[1], list) and args[1] else None
                what = f"{args[0].name}: " + (f"exec {cmd[0]}" if cmd else what)
            base_url = getattr(self, "engine", self).api.base_url
            raise EngineUnavailable(f"{what}: the Docker engine does not answer ({base_url}); "
                                    f"was it stopped or restarted? ({e})") from e
    return guarded


class ExecTimeout(ProviderError, TimeoutError):
    """A command did not finish within its timeout (it was killed)."""

    def __init__(self, machine: str, cmd: Sequence[str], timeout: float, partial: ExecResult):
        self.machine, self.cmd, self.timeout, self.result = machine, list(cmd), timeout, partial
        super().__init__(f"{machine}: {' '.join(cmd)} did not finish within {timeout:.0f}s")


class Engine:
    """One connection to the Docker engine (made on first use)."""

    def __init__(self) -> None:
        self._client: docker.DockerClient | None = None
        self._version: str | None = None

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            try:
                self._client = docker.from_env(timeout=300, max_pool_size=32)
                self._client.ping()
            except Exception as e:
                self._client = None
                where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
                raise ProviderError(f"cannot reach the Docker engine ({where}): {e}") from e
        return self._client

    @property
    def api(self) -> docker.APIClient:
        return self.client.api

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def is_local(self) -> bool:
        return self.api.base_url.startswith("http+docker://localhost")

    def major_version(self) -> int:
        if self._version is None:
            self._version = str(self.api.version().get("Version", "0"))
        try:
            return int(self._version.split(".")[0])
        except ValueError:
            return 0

    def started(self) -> float | None:
        """When the local Docker engine's process started (epoch seconds), or None."""
        if not self.is_local():
            return None
        try:
            pid = int(Path("/var/run/docker.pid").read_text().strip())
            return psutil.Process(pid).create_time()
        except (OSError, ValueError, psutil.Error):
            return None

    def why_stopped(self, machine: Machine) -> str:
        """For an error on a machine: that it is not running, since when, and whether
        the Docker engine restarted after it started (which stops every machine)."""
        try:
            st = self.api.inspect_container(machine.name)["State"]
        except (derr.APIError, requests.exceptions.RequestException):
            return ""
        if st.get("Running"):
            return ""
        why = (f" (machine {st.get('Status')}, exit code {st.get('ExitCode')}, "
               f"finished {st.get('FinishedAt', '?')[:19]})")
        started, engine = epoch(st.get("StartedAt")), self.started()
        if started and engine and engine > started:
            why += (f"; the Docker engine restarted at {time.strftime('%H:%M:%S', time.localtime(engine))}, after "
                    f"the machine started: a restart stops every machine of every cluster")
        return why

    # ------------------------------------------------------------------ exec
    def exec(self, machine: Machine, cmd: Sequence[str], *, input: bytes | None = None,
             check: bool = True, timeout: float | None = None, env: Mapping[str, str] | None = None) -> ExecResult:
        cmd = [str(c) for c in cmd]
        code, out, err = self._exec_bytes(machine, cmd, input, timeout, env)
        res = ExecResult(code, decode(out), decode(err))
        if check and res.exit_code != 0:
            raise ExecError(machine.name, cmd, res)
        return res

    @engine_guarded
    def _exec_bytes(self, machine: Machine, cmd: list[str], input: bytes | str | None = None,
                    timeout: float | None = None, env: Mapping[str, str] | None = None) -> tuple[int, bytes, bytes]:
        if isinstance(input, str):
            input = input.encode()
        try:
            ex = self.api.exec_create(machine.name, cmd, stdout=True, stderr=True, stdin=input is not None,
                                      tty=False, environment=dict(env) if env else None)
        except derr.NotFound as e:
            raise ProviderError(f"{machine.name}: no such machine") from e
        except derr.APIError as e:
            raise ProviderError(f"{machine.name}: exec {cmd[0]}: {e.explanation or e}"
                                f"{self.why_stopped(machine)}") from e
        sock, pending = hijack(self.api, f"/exec/{ex['Id']}/start", {"Detach": False, "Tty": False})
        out, err, timed_out = read_stream(sock, pending, input, timeout)
        if timed_out:
            self._kill_exec(ex["Id"])
            raise ExecTimeout(machine.name, cmd, timeout or 0, ExecResult(-1, decode(out), decode(err)))
        for _ in range(100):
            info = self.api.exec_inspect(ex["Id"])
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"]), out, err
            time.sleep(0.05)
        return -1, out, err

    def _kill_exec(self, exec_id: str) -> None:
        """Kill a timed-out exec's process (the engine has no API for it)."""
        try:
            pid = self.api.exec_inspect(exec_id).get("Pid")
            if pid and self.is_local():
                os.kill(int(pid), signal.SIGKILL)
        except Exception as e:  # best effort
            log.debug(f"could not kill exec {exec_id[:12]}: {e}")

    # ----------------------------------------------------------------- files
    def _on_tmpfs(self, machine: Machine, path: str) -> bool:
        """Whether path is on one of the container's tmpfs mounts while it
        runs: the engine's archive API only sees the container's filesystem
        and volumes, not tmpfs mounts (docker cp has the same limitation)."""
        try:
            info = self.api.inspect_container(machine.name)
        except derr.NotFound as e:
            raise ProviderError(f"{machine.name}: no such machine") from e
        if not info["State"].get("Running"):
            return False
        p = os.path.normpath(path)
        return any(p == t or p.startswith(t.rstrip("/") + "/") for t in (info["HostConfig"].get("Tmpfs") or {}))

    def copy_to(self, machine: Machine, dest: str, data: bytes, mode: int = 0o644) -> None:
        if not dest.startswith("/"):
            raise ValueError(f"copy_to: dest must be absolute, got {dest!r}")
        if isinstance(data, str):
            data = data.encode()
        if self._on_tmpfs(machine, dest):
            script = ('mkdir -p "$(dirname "$1")" && cat > "$1.kh-tmp" && chmod "$2" "$1.kh-tmp" '
                      '&& mv -f "$1.kh-tmp" "$1"')
            code, _, err = self._exec_bytes(machine, ["sh", "-c", script, "sh", dest, f"{mode:o}"], data, 300)
            if code != 0:
                raise ProviderError(f"{machine.name}: copy to {dest}: {decode(err).strip()}")
            return
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            ti = tarfile.TarInfo(dest.lstrip("/"))
            ti.size, ti.mode, ti.mtime = len(data), mode, int(time.time())
            tf.addfile(ti, io.BytesIO(data))
        try:
            # missing parent directories are created by the engine
            ok = self.api.put_archive(machine.name, "/", buf.getvalue())
        except derr.APIError as e:
            raise ProviderError(f"{machine.name}: copy to {dest}: {e.explanation or e}") from e
        if not ok:
            raise ProviderError(f"{machine.name}: copy to {dest} failed")

    def copy_from(self, machine: Machine, src: str) -> bytes:
        """A file's content; for a directory, a tar archive of it."""
        if self._on_tmpfs(machine, src):
            code, out, err = self._exec_bytes(
                machine, ["sh", "-c", 'if [ -d "$1" ]; then tar -C "$1" -cf - .; else cat "$1"; fi', "sh", src],
                None, 300)
            if code != 0:
                raise ProviderError(f"{machine.name}: copy from {src}: {decode(err).strip()}")
            return out
        try:
            stream, stat = self.api.get_archive(machine.name, src)
        except derr.NotFound as e:
            raise ProviderError(f"{machine.name}: {src}: no such file") from e
        except derr.APIError as e:
            raise ProviderError(f"{machine.name}: copy from {src}: {e.explanation or e}") from e
        raw = b"".join(stream)
        with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
            members = tf.getmembers()
            first = members[0] if members else None
            if first is not None and first.issym() and len(members) == 1:
                target = first.linkname if first.linkname.startswith("/") else \
                    os.path.normpath(os.path.join(os.path.dirname(src), first.linkname))
                return self.copy_from(machine, target)
            if first is not None and first.isfile() and len(members) == 1:
                f = tf.extractfile(first)
                return f.read() if f else b""
        return raw

    def logs(self, machine: Machine) -> str:
        try:
            return decode(self.api.logs(machine.name, stdout=True, stderr=True))
        except derr.NotFound:
            return ""


def epoch(docker_time: str | None) -> float | None:
    """Docker's RFC 3339 time (nanoseconds, Z) as epoch seconds."""
    if not docker_time or docker_time.startswith("0001-"):
        return None
    try:
        return datetime.fromisoformat(docker_time[:26].rstrip("Z").split(".")[0] + "+00:00").timestamp()
    except ValueError:
        return None


def decode(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b if isinstance(b, str) else b.decode("utf-8", errors="replace")
