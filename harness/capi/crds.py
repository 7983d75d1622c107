"""CRDs: the real Cluster API ones (fetched by release from the Go module
proxy, cached under ``$KUBE_HARNESS_CACHE/capi/<release>/``) and the
harness's own infrastructure CRDs (``harness/capi/crds/``); plus a
structural validator of objects against a CRD's openAPI v3 schema.

The CAPI CRDs are never hand-written here: ``go mod download -json
sigs.k8s.io/cluster-api@<release>`` gives the module's directory, whose
``config/crd/bases/cluster.x-k8s.io_<plural>.yaml`` are copied to the cache.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterable

import yaml
from filelock import FileLock

from . import CAPI_VERSION, DEFAULT_CAPI_RELEASE, INFRA_VERSION

log = logging.getLogger("harness.capi")

CAPI_MODULE = "sigs.k8s.io/cluster-api"
#: the core kinds the harness uses (plurals as in the CRD file names)
CAPI_PLURALS = ("clusters", "machines", "machinedeployments", "machinesets", "machinehealthchecks")
OUR_CRDS = Path(__file__).resolve().parent / "crds"


class CRDError(RuntimeError):
    pass


def release() -> str:
    return os.environ.get("KUBE_HARNESS_CAPI_VERSION") or DEFAULT_CAPI_RELEASE


def cache_root() -> Path:
    root = os.environ.get("KUBE_HARNESS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kube-harness")
    return Path(root) / "capi"


def _go() -> str:
    for cand in (shutil.which("go"), "/usr/local/go/bin/go"):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise CRDError("the Cluster API CRDs are fetched with `go mod download` from the Go module proxy, "
                   "but no go command was found (install Go, or put the CRDs under "
                   f"{cache_root()}/<release>/)")


def fetch_capi_crds(version: str | None = None) -> Path:
    """The directory holding ``cluster.x-k8s.io_<plural>.yaml`` of a CAPI
    release, downloading the module on first use."""
    version = version or release()
    if not re.match(r"^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$", version):
        raise CRDError(f"Cluster API release {version!r}: expected a tag like v1.8.4")
    dest = cache_root() / version
    done = dest / ".complete"
    if done.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock", timeout=600):
        if done.exists():
            return dest
        with tempfile.TemporaryDirectory(prefix="kh-capi-") as tmp:
            env = {**os.environ, "GOFLAGS": "-mod=mod", "GO111MODULE": "on"}
            go = _go()
            subprocess.run([go, "mod", "init", "khcapi"], cwd=tmp, env=env, check=True, capture_output=True)
            log.info(f"fetching {CAPI_MODULE}@{version} from the Go module proxy", extra={"phase": "capi-crds"})
            r = subprocess.run([go, "mod", "download", "-json", f"{CAPI_MODULE}@{version}"], cwd=tmp, env=env,
                               capture_output=True, text=True, timeout=900)
            try:
                info = json.loads(r.stdout or "{}")
            except json.JSONDecodeError:
                info = {}
            if r.returncode != 0 or not info.get("Dir"):
                raise CRDError(f"go mod download {CAPI_MODULE}@{version} failed: "
                               f"{info.get('Error') or r.stderr.strip()[-1000:]}")
        bases = Path(info["Dir"]) / "config" / "crd" / "bases"
        tmpdest = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmpdest, ignore_errors=True)
        tmpdest.mkdir()
        for plural in CAPI_PLURALS:
            src = bases / f"cluster.x-k8s.io_{plural}.yaml"
            if not src.is_file():
                raise CRDError(f"{CAPI_MODULE}@{version} has no {src.relative_to(info['Dir'])}")
            shutil.copyfile(src, tmpdest / src.name)
        (tmpdest / ".complete").write_text(json.dumps({"module": f"{CAPI_MODULE}@{version}",
                                                       "sum": info.get("Sum")}))
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmpdest, dest)
    return dest


def _load(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def capi_crds(version: str | None = None) -> list[dict]:
    d = fetch_capi_crds(version)
    return [doc for p in CAPI_PLURALS for doc in _load(d / f"cluster.x-k8s.io_{p}.yaml")]


def harness_crds() -> list[dict]:
    return [doc for p in sorted(OUR_CRDS.glob("*.yaml")) for doc in _load(p)]


def all_crds(version: str | None = None) -> list[dict]:
    return capi_crds(version) + harness_crds()


def find_crd(crds: Iterable[dict], kind: str, group: str | None = None) -> dict:
    for c in crds:
        if c["spec"]["names"]["kind"] == kind and (group is None or c["spec"]["group"] == group):
            return c
    raise KeyError(f"no CRD for kind {kind}")


def schema(crd: dict, version: str | None = None) -> dict:
    """The openAPI v3 schema of a served version (default: the storage one)."""
    for v in crd["spec"]["versions"]:
        if (version and v["name"] == version) or (not version and v.get("storage")):
            if not v.get("served"):
                raise CRDError(f"{crd['metadata']['name']} version {v['name']} is not served")
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(f"{crd['metadata']['name']} has no version {version}")


def schema_for(obj: dict, crds: Iterable[dict]) -> dict:
    group, _, version = obj["apiVersion"].rpartition("/")
    return schema(find_crd(crds, obj["kind"], group), version)


# --- validation ----------------------------------------------------------

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int, "number": (int, float)}


def validate(obj: Any, sch: dict, path: str = "") -> list[str]:
    """Errors of ``obj`` against a CRD structural schema: types, required
    fields, enums, string/number bounds, patterns, and unknown fields (the
    API server would silently prune those, so a typo would be lost).
    CEL rules (x-kubernetes-validations) are not evaluated."""
    errs: list[str] = []
    where = path or "(root)"
    if obj is None:
        if not sch.get("nullable"):
            errs.append(f"{where}: null is not allowed")
        return errs
    if sch.get("x-kubernetes-int-or-string"):
        if not isinstance(obj, (int, str)) or isinstance(obj, bool):
            errs.append(f"{where}: expected an integer or a string, got {type(obj).__name__}")
        return errs
    t = sch.get("type")
    if t:
        py = _TYPES[t]
        if not isinstance(obj, py) or (t in ("integer", "number") and isinstance(obj, bool)):
            return [f"{where}: expected {t}, got {type(obj).__name__} {obj!r:.60}"]
    if "enum" in sch and obj not in sch["enum"]:
        errs.append(f"{where}: {obj!r} is not one of {sch['enum']}")
    if isinstance(obj, str):
        if "maxLength" in sch and len(obj) > sch["maxLength"]:
            errs.append(f"{where}: longer than {sch['maxLength']}")
        if "minLength" in sch and len(obj) < sch["minLength"]:
            errs.append(f"{where}: shorter than {sch['minLength']}")
        if "pattern" in sch and not re.search(sch["pattern"], obj):
            errs.append(f"{where}: {obj!r} does not match {sch['pattern']}")
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        if "minimum" in sch and obj < sch["minimum"]:
            errs.append(f"{where}: {obj} < minimum {sch['minimum']}")
        if "maximum" in sch and obj > sch["maximum"]:
            errs.append(f"{where}: {obj} > maximum {sch['maximum']}")
    if isinstance(obj, list):
        if "maxItems" in sch and len(obj) > sch["maxItems"]:
            errs.append(f"{where}: more than {sch['maxItems']} items")
        if "minItems" in sch and len(obj) < sch["minItems"]:
            errs.append(f"{where}: fewer than {sch['minItems']} items")
        for i, item in enumerate(obj):
            errs += validate(item, sch.get("items") or {}, f"{path}[{i}]")
    if isinstance(obj, dict):
        props = sch.get("properties") or {}
        for req in sch.get("required") or []:
            if req not in obj:
                errs.append(f"{path + '.' if path else ''}{req}: required field is missing")
        addl = sch.get("additionalProperties")
        free = sch.get("x-kubernetes-preserve-unknown-fields") or addl is True
        for k, v in obj.items():
            p = f"{path}.{k}" if path else k
            if k in props:
                if path == "" and k == "metadata":
                    errs += _validate_metadata(v)
                else:
                    errs += validate(v, props[k], p)
            elif isinstance(addl, dict):
                errs += validate(v, addl, p)
            elif not free and (props or addl is False or t == "object"):
                errs.append(f"{p}: unknown field (the API server would prune it)")
    return errs


def _validate_metadata(meta: Any) -> list[str]:
    errs = []
    if not isinstance(meta, dict):
        return [f"metadata: expected object, got {type(meta).__name__}"]
    name = meta.get("name", "")
    if not name and not meta.get("generateName"):
        errs.append("metadata.name: required field is missing")
    if name and (len(name) > 253 or not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", name)):
        errs.append(f"metadata.name: {name!r} is not a DNS-1123 subdomain")
    for k in ("labels", "annotations"):
        for lk, lv in (meta.get(k) or {}).items():
            if not isinstance(lv, str):
                errs.append(f"metadata.{k}.{lk}: values must be strings, got {type(lv).__name__}")
            elif k == "labels" and (len(lv) > 63 or (lv and not re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", lv))):
                errs.append(f"metadata.labels.{lk}: {lv!r} is not a valid label value")
    return errs


def validate_object(obj: dict, crds: Iterable[dict]) -> list[str]:
    return [f"{obj['kind']}/{obj.get('metadata', {}).get('name')}: {e}" for e in validate(obj, schema_for(obj, crds))]


__all__ = ["fetch_capi_crds", "capi_crds", "harness_crds", "all_crds", "find_crd", "schema", "schema_for",
           "validate", "validate_object", "CRDError", "CAPI_VERSION", "INFRA_VERSION"]
