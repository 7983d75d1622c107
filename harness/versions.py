"""The supported Kubernetes releases: one entry per minor.

Each entry names the patch release the harness builds by default for that
minor and what kubeadm of that release asks for (etcd, CoreDNS, pause), plus
the crictl release of the same minor (sigs.k8s.io/cri-tools). Adding a minor
is one entry here (and a README line); every other module reads this table.
tests/test_versions.py checks the entries against the built kubeadm.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

VERSION_RE = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")


def parse(version: str) -> tuple[int, int, int]:
    m = VERSION_RE.match(version or "")
    if not m:
        raise ValueError(f"{version!r} is not vMAJOR.MINOR.PATCH")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


@dataclass(frozen=True)
class Release:
    version: str   # the default patch release of this minor
    etcd: str      # kubeadm's DefaultEtcdVersion
    coredns: str   # kubeadm's CoreDNSVersion
    pause: str     # kubeadm's PauseVersion
    crictl: str    # sigs.k8s.io/cri-tools at the same minor (or the nearest the proxy serves)

    @property
    def minor(self) -> int:
        return parse(self.version)[1]


RELEASES: dict[int, Release] = {r.minor: r for r in (
    Release("v1.35.4", etcd="3.6.6-0", coredns="v1.13.1", pause="3.10.1", crictl="v1.34.0"),
    Release("v1.36.3", etcd="3.6.8-0", coredns="v1.14.2", pause="3.10.2", crictl="v1.36.0"),
    Release("v1.37.2", etcd="3.7.0-0", coredns="v1.14.6", pause="3.10.2", crictl="v1.37.0"),
)}
DEFAULT_VERSION = "v1.37.2"
#: the version the upgrade test (and Cluster API v1.13, which supports up to v1.36) uses
PREVIOUS_VERSION = "v1.36.3"


def supported() -> str:
    """Human list for error messages: 'v1.35.x, v1.36.x, v1.37.x'."""
    return ", ".join(f"v1.{m}.x" for m in sorted(RELEASES))


def problem(version: object) -> str | None:
    """Why ``version`` is not supported (None when it is)."""
    if not isinstance(version, str) or not VERSION_RE.match(version):
        return f"a Kubernetes release like {DEFAULT_VERSION} (vMAJOR.MINOR.PATCH) of {supported()}"
    major, minor, _ = parse(version)
    if major != 1 or minor not in RELEASES:
        return f"a supported release: {supported()} (default {DEFAULT_VERSION})"
    return None


def release(version: str) -> Release:
    """The table entry of ``version``'s minor; ValueError naming the
    supported releases otherwise."""
    why = problem(version)
    if why:
        raise ValueError(f"Kubernetes version {version!r}; allowed: {why}")
    return RELEASES[parse(version)[1]]
