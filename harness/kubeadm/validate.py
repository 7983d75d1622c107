"""``spec.kubeadm`` patches checked by the real kubeadm, before anything is made.

The patches are free-form kubeadm documents, so their keys are not in the
spec's schema. The harness renders its configuration with each patched
document in turn and runs ``kubeadm config validate`` on it: kubeadm decodes
strictly (unknown or misspelt fields, wrong types) and runs its own
validation. Each finding becomes a SpecError naming ``spec.kubeadm.<document>.<field>``,
with a "did you mean" from the fields kubeadm's defaults and the harness's
configuration use at that level. Needs a kubeadm binary of the spec's version
on this host (:func:`harness.build.kube.cached_kubeadm`).
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from harness.spec import ClusterSpec, SpecError

from . import config

_PLACEHOLDER = config.Params("192.0.2.10:6443", "abcdef.0123456789abcdef")
_NODE = config.Node("validate-cp", "192.0.2.10", control_plane=True)
_WORKER = config.Node("validate-worker", "192.0.2.11")
_KIND_OF_ERROR = re.compile(r'Kind:"(\w+)"\}: (.*)', re.S)
_UNKNOWN = re.compile(r'unknown field "([^"]+)"')
_TYPE = re.compile(r"cannot unmarshal (\w+) into Go struct field \w+\.([\w.]+) of type ([\w.\[\]]+)")
_REASONS = "Invalid value|Unsupported value|Required value|Forbidden|Duplicate value|Too long|Too many|Not found"
_FIELD_ERROR = re.compile(rf'(?:^|\[|, )([A-Za-z][\w.\[\]]*): (?:{_REASONS})(?:: "(?:[^"\\]|\\.)*"|: [^:,]+)?: '
                          rf'(.*?)(?=, [A-Za-z][\w.\[\]]*: (?:{_REASONS})|\]?$)', re.S)
_KEY_OF_KIND = {kind: key for key, kind in config.PATCH_TARGETS.items()}


def check_kubeadm_patches(spec: ClusterSpec) -> bool:
    """:func:`check_patches` with the kubeadm of the spec's version, if this host
    has it (the kube build or release binaries); False when it could not check."""
    if not any(spec.kubeadm_patches.values()):
        return True
    try:
        from harness.build.kube import cached_kubeadm
    except ImportError:
        return False
    kubeadm = cached_kubeadm(spec.version)
    if kubeadm is None:
        return False
    check_patches(spec, kubeadm)
    return True


def check_patches(spec: ClusterSpec, kubeadm: Path) -> None:
    """Raise one SpecError listing every problem kubeadm finds in ``spec.kubeadm``."""
    if not any(spec.kubeadm_patches.values()):
        return
    errors: list[SpecError] = []
    for key, patch in spec.kubeadm_patches.items():
        if patch:
            errors += _problems(spec, key, kubeadm)
    if errors:
        raise SpecError.of(errors)


def _problems(spec: ClusterSpec, key: str, kubeadm: Path) -> list[SpecError]:
    """Render the configuration with only ``key``'s document patched and ask kubeadm."""
    only = dataclasses.replace(spec, kubeadm_patches={key: spec.kubeadm_patches[key]})
    path = f"spec.kubeadm.{key}"
    try:
        if key == "joinConfiguration":
            docs = [config.join_document(only, _PLACEHOLDER, _WORKER)]
        else:
            docs = config.init_documents(only, _PLACEHOLDER, _NODE)
    except ValueError as e:  # a patch the harness itself refuses (apiVersion, kind)
        field = str(e).split(":", 1)[0].rpartition(".")[2]
        return [SpecError(f"{path}.{field}", spec.kubeadm_patches[key].get(field),
                          str(e).split("allowed: ", 1)[-1], spec.source)]
    out = _validate(kubeadm, config.dump(docs))
    if out is None:
        return []
    return _findings(out, key, spec, kubeadm)


def _validate(kubeadm: Path, documents: str) -> str | None:
    """``kubeadm config validate`` of ``documents``: its error text, or None when it accepts them."""
    with tempfile.TemporaryDirectory(prefix="kh-kubeadm-validate-") as tmp:
        (Path(tmp) / "config.yaml").write_text(documents)
        p = subprocess.run([str(kubeadm), "config", "validate", "--config", str(Path(tmp) / "config.yaml")],
                           capture_output=True, text=True, timeout=60)
    if p.returncode == 0:
        return None
    return "\n".join(l for l in p.stderr.splitlines() if "To see the stack trace" not in l).strip()


def _findings(out: str, key: str, spec: ClusterSpec, kubeadm: Path) -> list[SpecError]:
    patch, path = spec.kubeadm_patches[key], f"spec.kubeadm.{key}"
    m = _KIND_OF_ERROR.search(out)
    kind, detail = (m.group(1), m.group(2)) if m else (config.PATCH_TARGETS[key], out.removeprefix("error: "))
    doc = f"kubeadm's {kind}"
    if _KEY_OF_KIND.get(kind, key) != key:  # kubeadm blamed another document: report it as is
        return [SpecError(path, patch, f"a {kind} patch that kubeadm accepts; kubeadm said: {detail}", spec.source)]
    unknown = _UNKNOWN.findall(detail)
    if unknown:
        known = _known_fields(kind, kubeadm, spec)
        errors = []
        for field in unknown:
            parent, _, name = field.rpartition(".")
            fields = sorted(known.get(parent, set()))
            close = difflib.get_close_matches(name, fields, n=1)
            allowed = f"a field of {doc}" + (f" (did you mean {close[0]!r}?)" if close else "")
            errors.append(SpecError(f"{path}.{field}", _lookup(patch, field), allowed, spec.source))
        return errors
    t = _TYPE.search(detail)
    if t:
        field = t.group(2)
        return [SpecError(f"{path}.{field}", _lookup(patch, field), f"a value of Go type {t.group(3)} in {doc}",
                          spec.source)]
    invalid = _FIELD_ERROR.findall(detail)
    if invalid:
        return [SpecError(f"{path}.{field}", _lookup(patch, field), f"a value {doc} accepts; kubeadm: {why.strip()}",
                          spec.source) for field, why in invalid]
    return [SpecError(path, patch, f"a {kind} patch that kubeadm accepts; kubeadm said: {detail}", spec.source)]


def _lookup(doc: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


_DEFAULTS: dict[tuple[str, str], list[dict]] = {}


def _known_fields(kind: str, kubeadm: Path, spec: ClusterSpec) -> dict[str, set[str]]:
    """Field names per dotted parent path, from kubeadm's printed defaults of
    ``kind`` and the harness's own unpatched rendering of it."""
    what = "join-defaults" if kind == "JoinConfiguration" else "init-defaults"
    if (str(kubeadm), what) not in _DEFAULTS:
        p = subprocess.run([str(kubeadm), "config", "print", what, "--component-configs",
                            "KubeletConfiguration,KubeProxyConfiguration"], capture_output=True, text=True,
                           timeout=60)
        _DEFAULTS[(str(kubeadm), what)] = [d for d in yaml.safe_load_all(p.stdout) if isinstance(d, dict)] \
            if p.returncode == 0 else []
    bare = dataclasses.replace(spec, kubeadm_patches={})
    docs = [*_DEFAULTS[(str(kubeadm), what)], *config.init_documents(bare, _PLACEHOLDER, _NODE),
            config.join_document(bare, _PLACEHOLDER, _WORKER)]
    known: dict[str, set[str]] = {}
    for d in docs:
        if d.get("kind") == kind:
            _collect(d, "", known)
    return known


def _collect(node: Any, prefix: str, into: dict[str, set[str]]) -> None:
    if isinstance(node, list):
        for item in node:
            _collect(item, prefix, into)
    elif isinstance(node, dict):
        into.setdefault(prefix, set()).update(str(k) for k in node)
        for k, v in node.items():
            _collect(v, f"{prefix}.{k}" if prefix else str(k), into)
