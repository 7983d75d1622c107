"""Running kubeadm on a machine: detached, its output followed into the log
line by line; failures raise KubeadmError with the output's tail (and the
kubelet's journal for init and join)."""
from __future__ import annotations

import logging
import shlex
import time

from harness.cluster import Cluster
from providers.base import ExecResult, Machine

from .context import ActionContext, KubeadmError

log = logging.getLogger("harness.kubeadm")

LOG_DIR = "/var/log/kube-harness"
OUTPUT_TAIL = 60


def tail(text: str, n: int = OUTPUT_TAIL) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


def kubeadm(ctx: ActionContext, m: Machine, args: list[str], what: str, timeout: float,
            stream: bool = True) -> str:
    """Run kubeadm on a machine; its output goes to the log line by line
    while it runs. Raises KubeadmError with the output's tail."""
    cluster = ctx.cluster
    cmd = ["kubeadm", *args]
    if not stream:
        r = cluster.provider.exec(m, cmd, check=False, timeout=timeout)
        out = r.stdout + r.stderr
        if not r.ok:
            raise KubeadmError(f"{m.name}: kubeadm {what} failed (exit {r.exit_code}):\n{tail(out)}", out)
        return out
    out, rc = _stream(cluster, m, cmd, f"kubeadm-{what}", timeout)
    if rc != 0:
        extra = kubelet_tails(cluster, [m.name], 20) if what in ("init", "join") else ""
        raise KubeadmError(f"{m.name}: kubeadm {what} failed ({'timed out' if rc is None else f'exit {rc}'})"
                           f"; last lines of its output:\n{tail(out)}{extra}", out)
    return out


def kubelet_tails(cluster: Cluster, names: list[str], lines: int = 25) -> str:
    out = []
    for name in names[:4]:
        try:
            m = cluster.machine(name)
            r = cluster.provider.exec(m, ["journalctl", "-u", "kubelet", "--no-pager", "-o", "cat",
                                          "-n", str(lines)], check=False, timeout=30)
            out.append(f"\n--- kubelet journal of {name} (last {lines} lines) ---\n{r.stdout.rstrip()}")
        except Exception as e:
            out.append(f"\n--- kubelet journal of {name}: unavailable ({e}) ---")
    return "".join(out)


def _stream(cluster: Cluster, m: Machine, cmd: list[str], name: str, timeout: float) -> tuple[str, int | None]:
    """Start ``cmd`` detached on the machine with its output in a file,
    and follow the file. Returns (output, exit code or None on timeout)."""
    p = cluster.provider
    logf, rcf, pidf = f"{LOG_DIR}/{name}.log", f"{LOG_DIR}/{name}.rc", f"{LOG_DIR}/{name}.pid"
    inner = f"{shlex.join(cmd)} >{logf} 2>&1; echo $? >{rcf}.tmp; mv {rcf}.tmp {rcf}"
    start = (f"mkdir -p {LOG_DIR} && rm -f {rcf} && : >{logf} && "
             f"(setsid bash -c {shlex.quote(inner)} </dev/null >/dev/null 2>&1 & echo $! >{pidf})")
    p.exec(m, ["bash", "-c", start], timeout=60)
    extra = {"cluster": cluster.name, "machine": m.name, "phase": name}
    offset, buf, chunks = 0, "", []
    end = time.monotonic() + timeout
    rc: int | None = None
    while True:
        r: ExecResult = p.exec(m, ["bash", "-c", f"cat {rcf} 2>/dev/null; echo; echo '--kh--'; "
                                                 f"tail -c +{offset + 1} {logf}"], check=False, timeout=60)
        head, _, data = r.stdout.partition("--kh--\n")
        if data:
            offset += len(data.encode())
            chunks.append(data)
            buf += data
            *lines, buf = buf.split("\n")
            for line in lines:
                _log_line(line, extra)
        code = head.strip()
        if code:
            rc = int(code) if code.lstrip("-").isdigit() else 1
            # the last output was written before the rc file
            r = p.exec(m, ["tail", "-c", f"+{offset + 1}", logf], check=False, timeout=60)
            if r.stdout:
                chunks.append(r.stdout)
                buf += r.stdout
            for line in buf.split("\n"):
                if line:
                    _log_line(line, extra)
            break
        if time.monotonic() > end:
            p.exec(m, ["bash", "-c", f"kill -TERM -- -$(cat {pidf}) 2>/dev/null || kill $(cat {pidf})"],
                   check=False, timeout=30)
            chunks.append(f"\n(kube-harness: killed after {timeout:.0f}s)\n")
            break
        time.sleep(1)
    return "".join(chunks), rc


def _log_line(line: str, extra: dict) -> None:
    line = line.rstrip()
    if not line:
        return
    # kubeadm's "[phase] ..." lines are its progress; klog lines (--v) go to the JSON log only
    if line.startswith("[") or line.startswith("Your Kubernetes") or line.startswith("This node has joined"):
        log.info(f"kubeadm: {line}", extra=extra)
    else:
        log.debug(f"kubeadm: {line}", extra=extra)
