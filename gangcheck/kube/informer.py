"""List+watch caches: one in-memory store per resource, kept current by a watch.

List, mark synced, watch from the list's resourceVersion with bookmarks, relist on 410 Gone or
on any broken watch (after a short backoff). Every change calls the handlers with the object's
old and new state so the controller can map it to work-queue keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from gangcheck.kube.client import Kube, Obj
from gangcheck.kube.errors import ApiError, GoneError, NotFoundError
from gangcheck.kube.resources import Resource

log = logging.getLogger(__name__)

Handler = Callable[[Obj | None, Obj | None], None]
"""Called with (old, new): old is None on add, new is None on delete."""


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


class Store:
    """The objects of one resource as last seen, by ``namespace/name`` (or ``name``)."""

    def __init__(self) -> None:
        self._objects: dict[str, Obj] = {}

    def get(self, name: str, namespace: str | None = None) -> Obj | None:
        return self._objects.get(f"{namespace}/{name}" if namespace else name)

    def __iter__(self) -> Iterator[Obj]:
        return iter(list(self._objects.values()))

    def __len__(self) -> int:
        return len(self._objects)

    def in_namespace(self, namespace: str) -> list[Obj]:
        return [o for o in self if o["metadata"].get("namespace") == namespace]

    def owned_by(self, uid: str) -> list[Obj]:
        return [o for o in self if any(r.get("uid") == uid for r in _owners(o))]

    def put_if_newer(self, obj: Obj) -> None:
        """Write-through after our own write, unless the watch already brought a newer one."""
        old = self._objects.get(object_key(obj))
        if old is None or _rv_number(old) <= _rv_number(obj):
            self._objects[object_key(obj)] = obj

    def _put(self, obj: Obj) -> Obj | None:
        key = object_key(obj)
        old = self._objects.get(key)
        self._objects[key] = obj
        return old

    def _pop(self, obj: Obj) -> Obj | None:
        return self._objects.pop(object_key(obj), None)

    def _replace(self, objs: list[Obj]) -> tuple[list[Obj], list[tuple[Obj | None, Obj]]]:
        """Replace everything; return (removed, [(old, new)]) for the handlers."""
        fresh = {object_key(o): o for o in objs}
        removed = [o for k, o in self._objects.items() if k not in fresh]
        changed = [
            (self._objects.get(k), o)
            for k, o in fresh.items()
            if _rv(self._objects.get(k)) != _rv(o)
        ]
        self._objects = fresh
        return removed, changed


def _owners(obj: Obj) -> list[dict[str, Any]]:
    refs: list[dict[str, Any]] = obj.get("metadata", {}).get("ownerReferences") or []
    return refs


def _rv_number(obj: Obj) -> int:
    """resourceVersions are opaque, but etcd's are increasing integers; -1 if not."""
    try:
        return int(obj.get("metadata", {}).get("resourceVersion", "-1"))
    except ValueError:
        return -1


def _rv(obj: Obj | None) -> str | None:
    return None if obj is None else obj.get("metadata", {}).get("resourceVersion")


class Informer:
    """Keeps a Store of one resource current and tells handlers about each change."""

    def __init__(
        self,
        kube: Kube,
        resource: Resource,
        *,
        label_selector: str | None = None,
        watch_timeout: int = 300,
        retry_delay: float = 1.0,
        optional: bool = False,
        absent_retry: float = 60.0,
    ) -> None:
        self.kube = kube
        self.resource = resource
        self.store = Store()
        self.synced = asyncio.Event()
        self._handlers: list[Handler] = []
        self._selector = label_selector
        self._watch_timeout = watch_timeout
        self._retry_delay = retry_delay
        self._optional = optional
        self._absent_retry = absent_retry
        self.served = True
        """False while an optional resource is not served (404): the cache is empty."""

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    async def run(self) -> None:
        """List and watch forever; relist after 410 or any broken watch."""
        while True:
            try:
                rv = await self._list()
                while True:
                    rv = await self._watch(rv)
            except asyncio.CancelledError:
                raise
            except NotFoundError as e:
                if self._optional:
                    self._absent()
                    await asyncio.sleep(self._absent_retry)
                else:
                    self._failed(e)
                    await asyncio.sleep(self._retry_delay)
            except GoneError:
                log.info("watch expired, relisting", extra={"resource": self.resource.plural})
            except Exception as e:  # any broken list or watch: the cache relists, never dies
                self._failed(e)
                await asyncio.sleep(self._retry_delay)

    def _failed(self, error: Exception) -> None:
        log.warning(
            "list/watch failed, relisting: %s", error, extra={"resource": self.resource.plural}
        )

    def _absent(self) -> None:
        """An optional resource this server does not serve: an empty cache, synced, and a
        look again later (a CRD installed, a feature turned on)."""
        if self.served:
            log.info("not served here; treated as empty", extra={"resource": self.resource.plural})
        self.served = False
        removed, _ = self.store._replace([])
        for obj in removed:
            self._notify(obj, None)
        self.synced.set()

    async def _list(self) -> str:
        listing = await self.kube.list_objects(self.resource, label_selector=self._selector)
        items = [self._typed(item) for item in listing.get("items") or []]
        removed, changed = self.store._replace(items)
        for obj in removed:
            self._notify(obj, None)
        for old, new in changed:
            self._notify(old, new)
        self.served = True
        self.synced.set()
        return str(listing["metadata"]["resourceVersion"])

    async def _watch(self, rv: str) -> str:
        events = self.kube.watch(
            self.resource,
            resource_version=rv,
            timeout_seconds=self._watch_timeout,
            label_selector=self._selector,
        )
        async with contextlib.aclosing(events):
            async for event in events:
                rv = self._apply(event, rv)
        return rv

    def _apply(self, event: Obj, rv: str) -> str:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code", 0))
            raise (GoneError if code == 410 else ApiError)(code, obj.get("reason", ""), str(obj))
        new_rv = str(obj.get("metadata", {}).get("resourceVersion", rv))
        if kind == "BOOKMARK":
            return new_rv
        obj = self._typed(obj)
        if kind == "DELETED":
            self._notify(self.store._pop(obj) or obj, None)
        else:
            self._notify(self.store._put(obj), obj)
        return new_rv

    def _typed(self, obj: Obj) -> Obj:
        """The object with its apiVersion and kind: the API server leaves them out of the
        items of a list of built-in resources, and owner references and Events need them."""
        if not obj.get("apiVersion") or not obj.get("kind"):
            obj = {**obj, "apiVersion": self.resource.api_version, "kind": self.resource.kind}
        return obj

    def _notify(self, old: Obj | None, new: Obj | None) -> None:
        for handler in self._handlers:
            try:
                handler(old, new)
            except Exception:  # a broken handler must not stop the cache
                log.exception("informer handler failed")
