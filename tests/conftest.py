"""Shared fixtures of the harness's own tests."""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Callable

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def write_spec(tmp_path) -> Callable[..., tuple[Path, str]]:
    """``write_spec(prefix, base="default.yaml", workers=None)``: a copy of a configs/ spec
    under a unique cluster name (and ``workers`` replicas); returns (path, name)."""
    def write(prefix: str, base: str = "default.yaml", workers: int | None = None) -> tuple[Path, str]:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        doc = yaml.safe_load((ROOT / "configs" / base).read_text())
        doc["metadata"]["name"] = name
        if workers is not None:
            doc["spec"]["topology"]["workers"]["machineDeployments"][0]["replicas"] = workers
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path, name
    return write
