"""``$ARTIFACTS/metadata.json``: what Prow's sidecar puts into the job's
``finished.json`` (under ``metadata``) and TestGrid reads from there.

Conventions followed (kubetest, kubetest2, test-infra):

* one flat JSON object of strings at ``$ARTIFACTS/metadata.json``, the path
  Prow's pod utilities give the test container (``ARTIFACTS=/logs/artifacts``);
* ``job-version`` and ``revision``: the version under test, as kubetest
  writes them (TestGrid's column header takes ``revision`` or ``job-version``);
  here the Kubernetes version of the session's clusters, also as
  ``k8s-version``;
* keys already in the file (written by an earlier step of the job, or by
  another tool) are kept, as kubetest2's testers do; a key two sessions give
  different values gets both, comma-separated.

Written by the controller process at the end of a pytest session (never by
an xdist worker), with the harness's version and commit, the provider, the
mode (direct, cluster-api, or existing for a cluster given by --kubeconfig,
whose version is the API server's) and what suites add with :func:`record`
(the conformance suite records its mode).

The harness's pytest plugin writes it (:func:`write_session`), so every
session that loads the harness does, wherever its test files are.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Mapping

import pytest

from . import __version__
from .progress import artifacts_dir

log = logging.getLogger("harness.metadata")

ROOT = Path(__file__).resolve().parent.parent
FILENAME = "metadata.json"
_KEY = pytest.StashKey[dict]()


def harness_commit(root: Path = ROOT) -> str:
    """The harness checkout's commit (``+dirty`` with uncommitted changes to
    tracked files); in Prow, where git may refuse a checkout another user
    owns, the commit the job tested (PULL_PULL_SHA, else PULL_BASE_SHA);
    "" when neither is known."""
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        if sha.returncode == 0 and sha.stdout.strip():
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=30)
            return sha.stdout.strip() + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("PULL_PULL_SHA") or os.environ.get("PULL_BASE_SHA") or ""


def merge(old: Mapping[str, object], new: Mapping[str, str]) -> dict[str, object]:
    """``old`` updated with ``new``; a string key both give different values
    gets both (comma-separated, each value once, first seen first)."""
    out = dict(old)
    for k, v in new.items():
        if not v:
            continue
        have = [x for x in out[k].split(",") if x] if isinstance(out.get(k), str) else []
        out[k] = ",".join(dict.fromkeys([*have, *v.split(",")]))
    return out


def write(values: Mapping[str, str], root: Path | None = None) -> Path:
    """Merge ``values`` into ``<root or $ARTIFACTS>/metadata.json`` (under a
    file lock: sessions may end at the same time).  An existing file that is
    not a JSON object is kept aside as ``metadata.json.invalid``, not lost."""
    from filelock import FileLock
    path = (root or artifacts_dir()) / FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    # one lock for every metadata.json on this host (the writes are tiny), beside the
    # runs' state, not among the artifacts
    lock = Path(os.environ.get("TMPDIR", "/tmp")) / "kube-harness" / "metadata.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock)):
        old: dict = {}
        if path.exists():
            try:
                old = json.loads(path.read_text())
                if not isinstance(old, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                log.warning(f"{path} unreadable ({e}); kept as {path.name}.invalid")
                path.replace(path.with_name(path.name + ".invalid"))
                old = {}
        data = merge(old, {k: str(v) for k, v in values.items()})
        tmp = path.with_name(f".{FILENAME}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
    return path


def record(config: pytest.Config, key: str, value: str) -> None:
    """Add ``key`` to this session's metadata.  Call it in the controller
    (a conftest's pytest_configure, say): what an xdist worker records stays
    on that worker, which writes nothing."""
    config.stash.setdefault(_KEY, {})[key] = str(value)


def session_values(config: pytest.Config) -> dict[str, str]:
    """The session's metadata: versions, provider, mode, and what was recorded."""
    values = {"kube-harness-version": __version__, "kube-harness-commit": harness_commit()}
    try:
        from .session import session_spec  # the session's validated spec, with its command-line overrides
        spec = session_spec(config)
        values.update({"k8s-version": spec.version, "job-version": spec.version, "revision": spec.version,
                       "kube-harness-provider": spec.provider})
    except Exception as e:  # the options were checked at start-up; say what is missing, write the rest
        log.warning(f"metadata.json without the Kubernetes version: {e}")
    try:
        values["kube-harness-mode"] = ("existing" if config.getoption("kubeconfig", None) else
                                       "cluster-api" if config.getoption("cluster_api") else "direct")
    except ValueError:  # the harness plugin is not loaded
        pass
    values.update(config.stash.get(_KEY, {}))
    return values


def write_session(config: pytest.Config) -> Path:
    """The session's metadata into $ARTIFACTS/metadata.json: the harness plugin
    calls it at the end of the controller's session (never in an xdist worker)."""
    path = write(session_values(config))
    log.info(f"wrote {path}", extra={"phase": "metadata", "event": "metadata"})
    return path

