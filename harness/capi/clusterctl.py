"""Runs the real clusterctl against a management cluster.

One :class:`Clusterctl` per management cluster: the binary, its config
file (the providers' repositories, see :mod:`.repository`, or a user's
``clusterctl.yaml``) and the management kubeconfig. Its output goes to the
harness's log (debug), and a command that fails raises
:class:`ClusterctlError` with the command and the tail of its output.
"""
from __future__ import annotations

import logging
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("harness.capi")


class ClusterctlError(Exception):
    pass


class MissingVariables(ClusterctlError):
    """The cluster template uses variables nobody set."""

    def __init__(self, message: str, names: list[str]):
        super().__init__(message)
        self.names = names


_MISSING_VARIABLES = re.compile(r"value for variables \[([^\]]*)\] is not set")


@dataclass
class Clusterctl:
    binary: Path
    config: Path
    kubeconfig: Path
    variables: dict[str, str] = field(default_factory=dict)  # template/components variables

    def run(self, *args: str, timeout: float = 600, kubeconfig: Path | None = None, cluster: bool = True) -> str:
        """``clusterctl <args>``; ``cluster=False`` for commands that take no --kubeconfig."""
        cmd = [str(self.binary), *args, "--config", str(self.config)]
        if cluster:
            cmd += ["--kubeconfig", str(kubeconfig or self.kubeconfig)]
        # clusterctl reads variables from its environment (and the config file)
        env = {**os.environ, **self.variables}
        with tempfile.TemporaryDirectory(prefix="kh-clusterctl-") as home:
            env.setdefault("XDG_CONFIG_HOME", home)  # its overrides/cache dir: not the user's
            t0 = time.monotonic()
            log.debug("run: " + " ".join(cmd), extra={"phase": "clusterctl"})
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired as e:
                raise ClusterctlError(f"{' '.join(cmd)}: no answer after {timeout:.0f}s") from e
        out = p.stdout + p.stderr
        for line in out.splitlines():
            log.debug(f"clusterctl: {line}", extra={"phase": "clusterctl"})
        if p.returncode:
            raise ClusterctlError(f"clusterctl {' '.join(args)} failed (exit {p.returncode}) after "
                                  f"{time.monotonic() - t0:.0f}s:\n{out[-3000:]}")
        return p.stdout

    def init(self, provider_args: list[str]) -> str:
        return self.run("init", *provider_args, timeout=900)

    def generate_cluster(self, name: str, namespace: str, kubernetes_version: str, control_planes: int,
                         workers: int, flavor: str = "", infrastructure: str = "", template: str = "") -> str:
        args = ["generate", "cluster", name, "--target-namespace", namespace,
                "--kubernetes-version", kubernetes_version,
                "--control-plane-machine-count", str(control_planes), "--worker-machine-count", str(workers)]
        if flavor:
            args += ["--flavor", flavor]
        if infrastructure:
            args += ["--infrastructure", infrastructure]
        if template:  # a file or URL instead of the provider's templates
            args += ["--from", template]
        try:
            return self.run(*args, timeout=120)
        except ClusterctlError as e:
            missing = _MISSING_VARIABLES.search(str(e))
            if missing:
                raise MissingVariables(str(e), [v.strip() for v in missing.group(1).split(",")]) from None
            raise

    def kubeconfig_of(self, name: str, namespace: str) -> str:
        return self.run("get", "kubeconfig", name, "--namespace", namespace, timeout=60)

    def describe(self, name: str, namespace: str) -> str:
        return self.run("describe", "cluster", name, "--namespace", namespace, "--show-conditions", "all",
                        timeout=60)

    def move(self, to_kubeconfig: Path, namespace: str) -> str:
        return self.run("move", "--to-kubeconfig", str(to_kubeconfig), "--namespace", namespace, timeout=900)
