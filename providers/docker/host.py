"""The harness host as node containers see it: capabilities --privileged cannot
grant, kernel files and devices to pass in, and the host limits every node shares."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from .engine import Engine
from .machine_config import HostFacts

log = logging.getLogger("harness.provider.docker")

# capability numbers -> names, as far as Docker 20.10 knows them (0..37)
_CAPS = ("CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE "
         "NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT "
         "SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE "
         "AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ").split()
NODE_DEVICES = ("/dev/kmsg", "/dev/fuse", "/dev/net/tun")
#: every node's systemd, containerd and kubelet take inotify instances from
#: the one host-wide per-user pool (all node containers run as root)
INOTIFY_MIN = {"max_user_instances": 512, "max_user_watches": 524288}


def missing_capabilities() -> list[str]:
    """Capabilities this host's root lacks (sandboxed hosts, e.g. no
    CAP_SYS_RESOURCE). ``--privileged`` asks runc for all of them and fails
    there ("unable to apply caps"), so nodes then get everything else."""
    try:
        status = Path("/proc/self/status").read_text()
        bnd = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("CapBnd:")), 16)
    except (OSError, StopIteration, ValueError):
        return []
    return [name for i, name in enumerate(_CAPS) if not bnd >> i & 1]


def host_facts(engine: Engine) -> HostFacts:
    local = engine.is_local()
    # kubeadm's SystemVerification reads the kernel config: /proc/config.gz or this file
    kconfig = f"/boot/config-{os.uname().release}"
    has_kconfig = local and os.path.isfile(kconfig) and not os.path.exists("/proc/config.gz")
    # an engine older than 23 asks runc for every capability with --privileged
    missing = missing_capabilities() if local and engine.major_version() < 23 else []
    return HostFacts(lib_modules=os.path.isdir("/lib/modules"), kernel_config=kconfig if has_kconfig else None,
                     missing_capabilities=tuple(missing),
                     devices=tuple(d for d in NODE_DEVICES if os.path.exists(d)))


def check_host_limits(cluster: str) -> None:
    """Warn when host limits make kubelets fail ("inotify_init: too many open
    files"), as kind's known-issues page describes."""
    low = {}
    for k, want in INOTIFY_MIN.items():
        try:
            have = int(Path(f"/proc/sys/fs/inotify/{k}").read_text())
        except (OSError, ValueError):
            continue
        if have < want:
            low[k] = (have, want)
    if low:
        fix = " ".join(f"fs.inotify.{k}={w}" for k, (_, w) in low.items())
        log.warning(f"host inotify limits are low ({', '.join(f'{k}={h}' for k, (h, _) in low.items())}): "
                    f"kubelets of several nodes/clusters fail with 'inotify_init: too many open files'; "
                    f"raise them with `sysctl -w {fix}`", extra={"cluster": cluster, "phase": "init"})


FREEZER = Path("/sys/fs/cgroup/freezer")


def thaw(pid: int, freezer: Path = FREEZER) -> list[str]:
    """Thaw the cgroup v1 freezer groups left FROZEN under the cgroup of a container's
    init process ``pid`` (a runc inside a node, killed while it froze a pod's cgroup,
    leaves one so; the engine then cannot kill the node: "did not receive an exit
    event"). Returns the groups thawed; nothing on cgroup v2 hosts or for a process
    not on this host."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return []
    path = next((ln.split(":", 2)[2] for ln in lines if ln.split(":", 2)[1] == "freezer"), None)
    if not pid or path is None:
        return []
    thawed = []
    for state in sorted((freezer / path.lstrip("/")).rglob("freezer.state")):
        try:
            if state.read_text().strip() != "THAWED":
                state.write_text("THAWED")
                thawed.append(str(state.parent))
        except OSError as e:
            log.debug(f"thawing {state.parent}: {e}")
    return thawed
