"""An exec's byte streams over a hijacked engine connection (what ``docker exec``
does): stdin written then half-closed, stdout and stderr demultiplexed, a deadline."""
from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import struct
import time
from typing import Any, Mapping

import docker

from providers.base import ProviderError


def hijack(api: docker.APIClient, path: str, body: Mapping[str, Any]) -> tuple[socket.socket, bytes]:
    """POST to the engine and take over the connection, returning the raw
    socket and bytes already read past the response headers."""
    base = api.base_url
    data = json.dumps(body).encode()
    if base.startswith("http+docker://localhost") or base.startswith("http+unix://"):
        addr = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(addr[len("unix://"):] if addr.startswith("unix://") else "/var/run/docker.sock")
    elif base.startswith("http://"):
        host, _, port = base[len("http://"):].partition(":")
        sock = socket.create_connection((host, int(port or 2375)))
    else:  # tls / ssh / npipe: let docker-py do the hijack
        s = api.exec_start(path.split("/")[2], socket=True)
        raw = getattr(s, "_sock", s)
        return raw, b""
    req = (f"POST /v{api.api_version}{path} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\n"
           f"Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data
    sock.sendall(req)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            sock.close()
            raise ProviderError(f"docker engine closed the connection on {path}")
        head += chunk
    header, _, rest = head.partition(b"\r\n\r\n")
    status = int(header.split(b" ", 2)[1])
    if status not in (101, 200):
        sock.close()
        raise ProviderError(f"docker engine: {path}: HTTP {status}: {rest.decode(errors='replace')[:500]}")
    return sock, rest


def read_stream(sock: socket.socket, pending: bytes, input: bytes | None,
                timeout: float | None) -> tuple[bytes, bytes, bool]:
    """Write input (then half-close), read the multiplexed stdout/stderr until
    EOF or the deadline: (stdout, stderr, timed out). Closes the socket."""
    deadline = None if timeout is None else time.monotonic() + timeout
    out, err = bytearray(), bytearray()
    buf = bytearray(pending)
    to_send = memoryview(input or b"")
    sent = 0
    wr_open = input is not None
    if not wr_open:
        _shutdown_write(sock)
    try:
        sock.setblocking(False)
        eof = False
        while not eof:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return bytes(out), bytes(err), True
            r, w, _ = select.select([sock], [sock] if wr_open else [], [], min(wait, 1.0) if wait else 1.0)
            if w and wr_open:
                try:
                    sent += sock.send(to_send[sent:sent + 65536])
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:  # process closed its stdin
                    sent = len(to_send)
                if sent >= len(to_send):
                    _shutdown_write(sock)
                    wr_open = False
            if r:
                try:
                    chunk = sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    chunk = None
                if chunk == b"":
                    eof = True
                elif chunk:
                    buf += chunk
            # demultiplex complete frames: [stream, 0, 0, 0, size(4, big endian)] payload
            while len(buf) >= 8:
                stream, size = buf[0], struct.unpack(">I", bytes(buf[4:8]))[0]
                if len(buf) < 8 + size:
                    break
                (err if stream == 2 else out).extend(buf[8:8 + size])
                del buf[:8 + size]
        return bytes(out), bytes(err), False
    finally:
        with contextlib.suppress(OSError):
            sock.close()


def _shutdown_write(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
