"""Removal of what the provider made, found by labels: containers with their
volumes (waiting while the engine still holds them), and everything matching a
label selector (teardown, the reaper)."""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Mapping

from docker import errors as derr

from providers.base import ProviderError

from .containers import label_filters
from .engine import Engine, engine_guarded
from .host import thaw

log = logging.getLogger("harness.provider.docker")


class Cleanup:
    def __init__(self, engine: Engine):
        self.engine = engine

    def remove_container(self, cid: str, name: str) -> list[str]:
        """Force-remove a container and its volumes; returns what was deleted."""
        api = self.engine.api
        deleted: list[str] = []
        vols: list[str] = []
        pid = 0
        try:
            info = api.inspect_container(cid)
            pid = (info.get("State") or {}).get("Pid") or 0
            vols = [m["Name"] for m in info.get("Mounts", []) if m.get("Type") == "volume" and m.get("Name")]
        except derr.NotFound:
            pass
        for attempt in (1, 2):
            try:
                api.remove_container(cid, force=True, v=True)
                deleted.append(f"machine/{name}")
            except derr.NotFound:
                pass
            except derr.APIError as e:
                if "removal of container" in str(e) and "already in progress" in str(e):
                    self._wait_gone(cid)
                elif attempt == 1 and "did not receive an exit event" in str(e) and (thawed := thaw(pid)):
                    log.warning(f"{name}: thawed {len(thawed)} frozen cgroups that kept it from dying; "
                                f"removing it again", extra={"machine": name, "phase": "cleanup"})
                    continue
                else:
                    raise ProviderError(f"removing container {name}: {e}") from e
            break
        for v in vols:
            if self.remove_volume(v):
                deleted.append(f"volume/{v}")
        return deleted

    def _wait_gone(self, cid: str, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                self.engine.api.inspect_container(cid)
            except derr.NotFound:
                return
            time.sleep(0.2)

    def remove_volume(self, name: str) -> bool:
        """Remove a volume, waiting while its container goes away; False when there was none."""
        for _ in range(20):
            try:
                self.engine.api.remove_volume(name, force=True)
                return True
            except derr.NotFound:
                return False
            except derr.APIError as e:
                if e.status_code == 409:  # still in use while its container goes away
                    time.sleep(0.25)
                    continue
                raise ProviderError(f"removing volume {name}: {e}") from e
        raise ProviderError(f"volume {name} stays in use")

    @engine_guarded
    def list_owned(self, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        api, filters = self.engine.api, label_filters(selector)
        objs: list[dict[str, Any]] = []
        for c in api.containers(all=True, filters=filters):
            objs.append({"kind": "machine", "name": c["Names"][0].lstrip("/"), "id": c["Id"],
                         "labels": c.get("Labels") or {}, "state": c.get("State")})
        for v in api.volumes(filters=filters).get("Volumes") or []:
            objs.append({"kind": "volume", "name": v["Name"], "id": v["Name"], "labels": v.get("Labels") or {}})
        for n in api.networks(filters=filters):
            objs.append({"kind": "network", "name": n["Name"], "id": n["Id"], "labels": n.get("Labels") or {}})
        return objs

    @engine_guarded
    def delete_owned(self, selector: Mapping[str, str]) -> list[str]:
        api = self.engine.api
        deleted: list[str] = []
        objs = self.list_owned(selector)
        errors: list[str] = []
        for o in (o for o in objs if o["kind"] == "machine"):
            try:
                deleted += self.remove_container(o["id"], o["name"])
            except ProviderError as e:
                errors.append(str(e))
        for v in api.volumes(filters=label_filters(selector)).get("Volumes") or []:
            try:
                if self.remove_volume(v["Name"]):
                    deleted.append(f"volume/{v['Name']}")
            except ProviderError as e:
                errors.append(str(e))
        for o in (o for o in objs if o["kind"] == "network"):
            try:
                info = api.inspect_network(o["id"])
                for cid in (info.get("Containers") or {}):
                    with contextlib.suppress(derr.APIError):
                        api.disconnect_container_from_network(cid, o["id"], force=True)
                api.remove_network(o["id"])
                deleted.append(f"network/{o['name']}")
            except derr.NotFound:
                pass
            except derr.APIError as e:
                errors.append(f"removing network {o['name']}: {e}")
        if deleted:
            log.info(f"deleted {len(deleted)} objects matching {dict(selector)}", extra={"phase": "cleanup"})
        if errors:
            raise ProviderError("cleanup incomplete: " + "; ".join(errors))
        return deleted
