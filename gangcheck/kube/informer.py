"""List+watch caches: one in-memory store per resource, kept current by a watch.

List, mark synced, watch from the list's resourceVersion with bookmarks. A broken or stalled
watch is watched again from the last resourceVersion seen (after an exponential backoff with
jitter); only 410 Gone, the server saying that version is no longer kept, makes it relist.
Every change calls the handlers with the object's old and new state so the controller can map
it to work-queue keys. After a write of ours the store holds the object the API server
answered (`Store.put_if_newer`) and never goes back to an earlier version the watch still
brings; the handlers hear the watch's versions one after the other, so the echo of our own
write says nothing new and another writer's change before it is still heard. An answer read
once the watch (or a list) is past its version, the object not in the store, is of an object
deleted since (another writer's delete, brought by the watch while the answer was on its
way): it is not stored, or a cache would hold for ever an object the API server no longer has
(a Workload deleted as its check was written, its requests never withdrawn). After a delete of
ours the object is gone from the store at once (`Store.deleted`), and what the watch still
brings of it before its DELETED does not bring it back. A relist does not undo either when its
list was served before the write or delete was answered (the list's resourceVersion older than
it): the store keeps what the list cannot have seen (`Store._replace`). resourceVersions are
compared as the integers etcd makes them (`_rv_number`), as Kubernetes' own comparison of
them does since 1.35.

``authoritative`` says whether the store may be trusted to show that an object is *absent*:
true only after a list the server answered, false again as soon as a list or watch of an
optional resource answers 404. Absence is what cleanup acts on, so nothing is deleted on the
word of a cache that is not authoritative. A 404 on a list or watch is taken for "not served"
only when discovery agrees (the resource is missing from its group version's document); a
resource discovery serves is listed again with the usual backoff, kept as last seen. One
served before and then not is kept as last seen for `absent_grace` seconds (a restarting
server's discovery is not a CRD removed), and only then emptied. A resource not served is
looked for again with a backoff growing to `absent_retry` seconds. With `forbidden_is_absent`
(an optional resource the controller can do without, whose rights an install may not grant),
a list refused (403) is taken the same way: an empty cache, synced, a warning logged, and
listed again with that backoff until allowed.

``current`` says whether the store may be trusted to hold every change made until a moment
ago: false from a failed list or watch (or a stalled one) until a list is answered, or a watch
has been answered again for ``CURRENT_AFTER_SECONDS`` (the changes missed meanwhile, from the
last version seen, come first). What is decided from the whole set of objects, such as which
nodes arrived for an attempt being rolled back, waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Set
from dataclasses import dataclass
from typing import Any

from gangcheck.kube.client import WATCH_QUIET_SECONDS, Kube
from gangcheck.kube.discovery import serves
from gangcheck.kube.errors import (
    ApiError,
    ForbiddenError,
    GoneError,
    NotFoundError,
    TransientError,
)
from gangcheck.kube.resources import Resource
from gangcheck.model.objects import Obj

log = logging.getLogger(__name__)

Handler = Callable[[Obj | None, Obj | None], None]
"""Called with (old, new): old is None on add, new is None on delete."""
Transform = Callable[[Obj], Obj]
"""What a cache keeps of an object: the fields the controller reads, to save memory."""
MAX_BACKOFF_SECONDS = 30.0
#: How long a watch answered again after a failure runs before the store counts as current.
CURRENT_AFTER_SECONDS = 1.0


def jittered(base: float, failures: int, *, cap: float = MAX_BACKOFF_SECONDS) -> float:
    """Full jitter: a random wait up to base * 2^(failures-1), capped."""
    ceiling = min(cap, base * 2 ** max(0, failures - 1))
    return random.uniform(ceiling / 2, ceiling)


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


class Store:
    """The objects of one resource as last seen, by ``namespace/name`` (or ``name``), with
    an index by namespace so a namespace's objects are found without a scan."""

    def __init__(self, transform: Transform | None = None) -> None:
        self._objects: dict[str, Obj] = {}
        self._by_namespace: dict[str, dict[str, Obj]] = {}
        self._indexers: list[Handler] = []
        self._behind: dict[str, Obj] = {}
        """Keys whose stored object is our own write, not yet brought back by the watch: the
        last version the watch brought, the handlers' old state until it catches up."""
        self._tombstones: dict[str, _Tombstone] = {}
        """Keys whose object our own delete removed, the watch's DELETED of it not yet come:
        what the watch still brings of that object is heard but not stored (`deleted`)."""
        self.transform = transform
        """What is kept of each object (None: all of it), applied to everything stored."""
        self._seen = -1
        """The resourceVersion the list and the watch have brought the store to: every change
        up to it is in (-1: none yet, or a store emptied without a list)."""

    def add_indexer(self, indexer: Handler) -> None:
        """Call `indexer(old, new)` on every change of the store, our own write-throughs
        included, so that what it keeps always matches the store (handlers of the informer
        hear only what the API server reports)."""
        self._indexers.append(indexer)

    def get(self, name: str, namespace: str | None = None) -> Obj | None:
        return self._objects.get(f"{namespace}/{name}" if namespace else name)

    def __iter__(self) -> Iterator[Obj]:
        return iter(list(self._objects.values()))

    def __len__(self) -> int:
        return len(self._objects)

    def values(self) -> Collection[Obj]:
        """The objects, not copied: a live view, to read without an await in between."""
        return self._objects.values()

    def keys(self) -> Set[str]:
        """The keys (``namespace/name`` or ``name``), not copied: a live view."""
        return self._objects.keys()

    def in_namespace(self, namespace: str) -> list[Obj]:
        return list(self._by_namespace.get(namespace, {}).values())

    def owned_by(self, uid: str) -> list[Obj]:
        return [o for o in self if any(r.get("uid") == uid for r in _owners(o))]

    def is_behind(self, obj: Obj) -> bool:
        """Whether the store has `obj` older than this version of it, or not at all: a
        decision made on the store has not seen it as it is."""
        old = self._objects.get(object_key(obj))
        return old is None or _rv_number(old) < _rv_number(obj)

    def put_if_newer(self, obj: Obj) -> None:
        """Write-through after our own write, unless the watch already brought a newer one
        (or the object is one our own delete removed, or one gone: the watch, or a list, is
        past this version and the store has no such object)."""
        if self.transform is not None:
            obj = self.transform(obj)
        key = object_key(obj)
        tomb = self._tombstones.get(key)
        if tomb is not None and tomb.buries(obj):
            return
        old = self._objects.get(key)
        if old is None and 0 <= _rv_number(obj) <= self._seen:
            return  # the watch brought this version, then the object's deletion
        if old is None or _rv_number(old) <= _rv_number(obj):
            if old is not None:
                self._behind.setdefault(key, old)
            self._put(obj)

    def deleted(
        self, name: str, namespace: str | None, answer: Obj | None, *, uid: str | None = None
    ) -> None:
        """Write-through after our own DELETE of `name` (at `uid`, if it was given) succeeded:
        `answer` is what the API server answered (None for a 404: gone already). An object
        kept by its finalizers (or a grace period) is stored as answered, with its
        deletionTimestamp (`put_if_newer`). One gone is dropped at once, and a tombstone
        keeps what the watch still brings of it (its ADDED or MODIFIED made before the
        delete: the same uid, or a resourceVersion not newer than the deletion) from
        bringing it back: a gang decided again on it would take the deleted object, its
        records, for the next one made under its name. Another object of that name (made
        again: another uid) is stored as usual. The watch's DELETED of it, or a relist
        that shows it gone (listed at or past the deletion, or another object of that name
        listed), clears the tombstone; a relist older than the deletion keeps it. Nothing
        is done when the store no longer has that object (the watch brought its DELETED
        already, or holds another one of that name)."""
        if answer is not None and answer.get("kind") != "Status" and _kept(answer):
            self.put_if_newer(answer)
            return
        key = f"{namespace}/{name}" if namespace else name
        stored = self._objects.get(key)
        gone = _uid(answer) or _status_uid(answer) or uid
        if stored is None or (gone and _uid(stored) and _uid(stored) != gone):
            return
        at = _rv_number(answer) if answer is not None and answer.get("kind") != "Status" else -1
        watched = self._behind.get(key, stored)
        self._pop(stored)
        self._tombstones[key] = _Tombstone(
            uid=gone or _uid(stored), rv=max(at, _rv_number(stored)), watched=watched
        )

    def _deleted_by_watch(self, obj: Obj) -> Obj | None:
        """The watch's DELETED of `obj`: the stored object removed (the old state for the
        handlers), unless the store holds another object of that name (made again since:
        another uid); the tombstone of `obj` cleared."""
        key = object_key(obj)
        tomb = self._tombstones.get(key)
        if tomb is not None and (tomb.buries(obj) or _rv_number(obj) > tomb.rv):
            del self._tombstones[key]
        stored = self._objects.get(key)
        if stored is not None and _uid(obj) and _uid(stored) and _uid(stored) != _uid(obj):
            return None
        return self._pop(obj)

    def _from_watch(self, obj: Obj) -> tuple[Obj | None, Obj]:
        """A version the watch brought, stored, unless our own write stored a later one:
        the watch still brings the changes made before that write, and storing them would
        show, until it catches up, an object without our write (a gang decided again on it
        would undo what it just wrote). Returns (old, new) for the handlers: the versions as
        the watch brought them, one after the other, so another writer's change is heard and
        the echo of our own write is not."""
        key = object_key(obj)
        tomb = self._tombstones.get(key)
        if tomb is not None:
            if tomb.buries(obj):  # made before our delete: heard, not stored
                told, tomb.watched = tomb.watched, obj
                return told, obj
            del self._tombstones[key]  # a newer object: the watch is past the deletion
        watched = self._behind.pop(key, None)
        if watched is not None:
            stored = self._objects.get(key)
            if stored is not None and 0 <= _rv_number(obj) < _rv_number(stored):
                self._behind[key] = obj
                return watched, obj
        return self._put(obj), obj

    def _watched(self, resource_version: str) -> None:
        """The watch brought every change up to `resource_version` (an event's, a bookmark's)."""
        self._seen = max(self._seen, _version(resource_version))

    def _put(self, obj: Obj) -> Obj | None:
        key = object_key(obj)
        old = self._objects.get(key)
        self._objects[key] = obj
        if old is not None and _namespace(old) != _namespace(obj):
            self._unindex(key, old)
        self._index(key, obj)
        self._tell(old, obj)
        return old

    def _pop(self, obj: Obj) -> Obj | None:
        key = object_key(obj)
        self._behind.pop(key, None)
        old = self._objects.pop(key, None)
        if old is not None:
            self._unindex(key, old)
            self._tell(old, None)
        return old

    def _tell(self, old: Obj | None, new: Obj | None) -> None:
        for indexer in self._indexers:
            indexer(old, new)

    def _index(self, key: str, obj: Obj) -> None:
        if namespace := _namespace(obj):
            self._by_namespace.setdefault(namespace, {})[key] = obj

    def _unindex(self, key: str, obj: Obj) -> None:
        here = self._by_namespace.get(_namespace(obj))
        if here is not None:
            here.pop(key, None)
            if not here:
                del self._by_namespace[_namespace(obj)]

    def _replace(
        self, objs: list[Obj], resource_version: str | None = None
    ) -> tuple[list[Obj], list[tuple[Obj | None, Obj]]]:
        """Replace everything with a list answered at `resource_version`; return (removed,
        [(old, new)]) for the handlers. What the list cannot have seen, being newer than it
        (a list served before our own write or delete was answered), is kept: our write of
        an object listed older, or not listed while the list is older than it (made after
        it); our delete of an object listed (the same uid, or without one, a version not
        newer than the deletion), with the object made again under its name after the list
        (another uid, newer than it) if we have it, or not listed while the list is older
        than the deletion.
        The watch from the list's version on brings what came between, and `_from_watch`
        and `_deleted_by_watch` keep it out as after any write of ours. Without a version
        (a resource not served: emptied), nothing is kept."""
        at = _version(resource_version)
        fresh = {object_key(o): o for o in objs}
        kept: dict[str, Obj] = {}
        behind: dict[str, Obj] = {}
        tombstones: dict[str, _Tombstone] = {}
        heard: list[tuple[Obj | None, Obj]] = []  # what the handlers hear, the store aside
        for key, obj in fresh.items():
            tomb = self._tombstones.get(key)
            if tomb is not None and tomb.buries(obj):  # listed before our delete
                tombstones[key] = tomb
                if _rv(tomb.watched) != _rv(obj):
                    heard.append((tomb.watched, obj))
                tomb.watched = obj
                stored = self._objects.get(key)
                if stored is not None and 0 <= at < _rv_number(stored):  # made again after
                    kept[key] = stored
                    behind[key] = self._behind.get(key, stored)
                continue
            stored = self._objects.get(key)
            if stored is not None and 0 <= _rv_number(obj) < _rv_number(stored):
                kept[key] = stored  # our write, listed as it was before it
                watched = self._behind.get(key, stored)
                if _rv(watched) != _rv(obj):
                    heard.append((watched, obj))
                behind[key] = obj
        for key, stored in self._objects.items():
            if key not in fresh and 0 <= at < _rv_number(stored):  # made after the list
                kept[key] = stored
                behind[key] = self._behind.get(key, stored)
        for key, tomb in self._tombstones.items():
            if key not in fresh and 0 <= at < tomb.rv:  # deleted after the list
                tombstones[key] = tomb
        objects = {**{k: o for k, o in fresh.items() if k not in tombstones}, **kept}
        removed = [o for k, o in self._objects.items() if k not in objects]
        changed = [
            (self._objects.get(k), o)
            for k, o in objects.items()
            if k not in kept and _rv(self._objects.get(k)) != _rv(o)
        ]
        self._objects = objects
        self._behind = behind
        self._tombstones = tombstones
        self._seen = at
        self._by_namespace = {}
        for key, obj in objects.items():
            self._index(key, obj)
        for obj in removed:
            self._tell(obj, None)
        for old, new in changed:
            self._tell(old, new)
        return removed, changed + heard


@dataclass
class _Tombstone:
    """An object our own delete removed from the store (`Store.deleted`), until the watch
    says so: its uid, the resourceVersion it was deleted at (as far as known: at least the
    last one stored), and the last version of it the watch brought (the handlers' old state
    for the next one it brings)."""

    uid: str
    rv: int
    watched: Obj

    def buries(self, obj: Obj) -> bool:
        """Whether `obj` is a version of the deleted object: the same uid or, without one to
        compare, a resourceVersion not newer than the deletion."""
        uid = _uid(obj)
        if self.uid and uid:
            return uid == self.uid
        return _rv_number(obj) <= self.rv


class Index:
    """A store's objects by keys worked out from each object (`keys_of`), kept from the
    store's changes: a lookup reads the objects of one key, not every object of a namespace.
    Store keys are kept, the objects read from the store."""

    def __init__(self, store: Store, keys_of: Callable[[Obj], Iterable[Hashable]]) -> None:
        self._store = store
        self._keys_of = keys_of
        self._members: dict[Hashable, set[str]] = {}
        store.add_indexer(self._on_change)

    def _on_change(self, old: Obj | None, new: Obj | None) -> None:
        if old is not None:
            for key in self._keys_of(old):
                members = self._members.get(key)
                if members is not None:
                    members.discard(object_key(old))
                    if not members:
                        del self._members[key]
        if new is not None:
            for key in self._keys_of(new):
                self._members.setdefault(key, set()).add(object_key(new))

    def of(self, key: Hashable) -> list[Obj]:
        """The objects with `key`, ordered by namespace and name."""
        found = sorted(self._members.get(key, ()))
        return [o for k in found if (o := self._store.get(k)) is not None]


def _namespace(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("namespace") or "")


def _owners(obj: Obj) -> list[dict[str, Any]]:
    refs: list[dict[str, Any]] = obj.get("metadata", {}).get("ownerReferences") or []
    return refs


def _rv_number(obj: Obj) -> int:
    """resourceVersions are opaque, but etcd's are increasing integers; -1 if not."""
    return _version(obj.get("metadata", {}).get("resourceVersion"))


def _version(resource_version: str | None) -> int:
    """A resourceVersion as the integer etcd's are (an object's or a list's); -1 if not one."""
    try:
        return int(resource_version if resource_version is not None else "-1")
    except ValueError:
        return -1


def _uid(obj: Obj | None) -> str:
    return "" if obj is None else str(obj.get("metadata", {}).get("uid") or "")


def _status_uid(answer: Obj | None) -> str:
    """The uid a DELETE's Status answer names (`details.uid`), '' if none."""
    if answer is None or answer.get("kind") != "Status":
        return ""
    return str((answer.get("details") or {}).get("uid") or "")


def _kept(obj: Obj) -> bool:
    """Whether an object a DELETE answered is still there: held by its finalizers, or in a
    grace period (a pod), rather than the last state of one gone."""
    meta = obj.get("metadata", {})
    return bool(meta.get("finalizers")) or bool(meta.get("deletionGracePeriodSeconds"))


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
        absent_grace: float = 60.0,
        forbidden_is_absent: bool = False,
        quiet_seconds: float = WATCH_QUIET_SECONDS,
        transform: Transform | None = None,
    ) -> None:
        self.kube = kube
        self.resource = resource
        self.store = Store(transform)
        self.synced = asyncio.Event()
        self._handlers: list[Handler] = []
        self._selector = label_selector
        self._watch_timeout = watch_timeout
        self._retry_delay = retry_delay
        self._optional = optional
        self._absent_retry = absent_retry
        self._absent_grace = absent_grace
        self._forbidden_is_absent = forbidden_is_absent and optional
        self._quiet_seconds = quiet_seconds
        self._failures = 0
        self._rv = ""
        self._absent_since: float | None = None
        self.served = True
        """False while an optional resource is not served (404): the cache is empty."""
        self.authoritative = False
        """True once a list was answered and until a 404 makes the resource's presence
        uncertain: only then does an object missing from the store mean it is gone."""
        self.relists = 0
        """Lists made after the first (each one after a 410, or a failed list)."""
        self.last_error = ""
        """The last failed list or watch, as logged (empty: none yet): what a cache that does
        not sync is waiting on (`Controller.run` says it)."""
        self._stale_since: float | None = None
        self._opened_at: float | None = None

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    @property
    def current(self) -> bool:
        """No list or watch failure since the last list, or a watch answered again since the
        last failure and running for CURRENT_AFTER_SECONDS (see the module doc)."""
        if self._stale_since is None:
            return True
        opened = self._opened_at
        return (
            opened is not None
            and opened > self._stale_since
            and (time.monotonic() - opened >= CURRENT_AFTER_SECONDS)
        )

    def _stale(self) -> None:
        """A list or watch failed, or a watch stalled: changes may be missing until a watch is
        answered after this, the latest failure."""
        self._stale_since = time.monotonic()

    def _opened(self) -> None:
        self._opened_at = time.monotonic()

    async def run(self) -> None:
        """List, then watch forever from the last resourceVersion; relist only after 410."""
        listed = False
        while True:
            try:
                if listed:
                    self.relists += 1
                rv = await self._list()
                listed = True
                await self._watch_until_gone(rv)
                log.info("watch expired (410), relisting", extra={"resource": self.resource.plural})
            except asyncio.CancelledError:
                raise
            except NotFoundError as e:
                await asyncio.sleep(await self._not_found(e))
            except ForbiddenError as e:
                await asyncio.sleep(self._forbidden(e))
            except Exception as e:  # a failed list: the cache lists again, never dies
                await asyncio.sleep(self._failed(e))

    async def _watch_until_gone(self, rv: str) -> None:
        """Watch from rv, again and again from the last version seen; return when the server
        says that version is gone (410)."""
        self._rv = rv
        while True:
            began = time.monotonic()
            try:
                await self._watch()
                self._failures = 0
                if time.monotonic() - began < 1.0:  # ended at once: not a loop to spin in
                    await asyncio.sleep(jittered(self._retry_delay, 1))
            except GoneError:
                return
            except NotFoundError:
                raise
            except ApiError as e:  # broken, cut or stalled: watch again from where we were
                if e.reason == "WatchStalled":  # a quiet resource, or a stuck connection
                    log.info("%s; watching again", e, extra={"resource": self.resource.plural})
                    self._stale()
                    continue
                await asyncio.sleep(self._failed(e))

    def _failed(self, error: Exception) -> float:
        """Log a failed list or watch; the jittered backoff before the next try."""
        self._stale()
        self._failures += 1
        self.last_error = str(error) or type(error).__name__
        delay = jittered(self._retry_delay, self._failures)
        log.warning(
            "list/watch failed (%d in a row), again in %.1fs: %s",
            self._failures,
            delay,
            error,
            extra={"resource": self.resource.plural},
        )
        return delay

    async def _not_found(self, error: NotFoundError) -> float:
        """A 404 on the list or watch: the wait before looking again."""
        self.authoritative = False
        self._stale()
        if not self._optional:
            return self._failed(error)
        try:
            served = await serves(self.kube, self.resource)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # discovery failed too: not known, look again soon
            return self._failed(e)
        if served:  # a passing 404 (a proxy, a server starting): kept as last seen
            return self._failed(error)
        if not self.synced.is_set() or not self.served:
            return self._absent()  # never served here (or absent already): empty
        now = time.monotonic()
        if self._absent_since is None:
            self._absent_since = now
        if now - self._absent_since >= self._absent_grace:
            return self._absent()
        return self._failed(error)  # kept as last seen meanwhile: discovery may be catching up

    def _forbidden(self, error: ForbiddenError) -> float:
        """A list refused (403): with `forbidden_is_absent`, as not served (said once, as a
        warning: the install lacks a right); else a failure like any other."""
        if not self._forbidden_is_absent:
            return self._failed(error)
        if self.served:
            log.warning(
                "not allowed to list (%s); treated as empty until allowed",
                error,
                extra={"resource": self.resource.plural},
            )
        return self._absent(told=True)

    def _absent(self, *, told: bool = False) -> float:
        """An optional resource this server does not serve: an empty cache, synced, not
        authoritative; the wait before looking again (a CRD installed, a feature turned on),
        growing to `absent_retry`."""
        if self.served and not told:
            log.info("not served here; treated as empty", extra={"resource": self.resource.plural})
        self.served = False
        self.authoritative = False
        removed, _ = self.store._replace([])
        for obj in removed:
            self._notify(obj, None)
        self.synced.set()
        self._failures += 1
        return jittered(self._retry_delay, self._failures, cap=self._absent_retry)

    async def _list(self) -> str:
        listing = await self.kube.list_objects(self.resource, label_selector=self._selector)
        items = [self._typed(item) for item in listing.get("items") or []]
        rv = str(listing["metadata"]["resourceVersion"])
        removed, changed = self.store._replace(items, rv)
        for obj in removed:
            self._notify(obj, None)
        for old, new in changed:
            self._notify(old, new)
        self.served = True
        self.authoritative = True
        self._absent_since = None
        self._stale_since = None
        self._failures = 0
        self.synced.set()
        return rv

    async def _watch(self) -> None:
        """One watch from the last version seen, each event moving that version on."""
        events = self.kube.watch(
            self.resource,
            resource_version=self._rv,
            timeout_seconds=self._watch_timeout,
            label_selector=self._selector,
            quiet_seconds=self._quiet_seconds,
            opened=self._opened,
        )
        async with contextlib.aclosing(events):
            async for event in events:
                self._rv = self._apply(event, self._rv)

    def _apply(self, event: Obj, rv: str) -> str:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code", 0))
            error = {410: GoneError, 404: NotFoundError}.get(code, TransientError)
            raise error(code, obj.get("reason", ""), str(obj.get("message", obj)))
        new_rv = str(obj.get("metadata", {}).get("resourceVersion", rv))
        if kind != "BOOKMARK":
            obj = self._typed(obj)
            if kind == "DELETED":
                self._notify(self.store._deleted_by_watch(obj) or obj, None)
            else:
                self._notify(*self.store._from_watch(obj))
        self.store._watched(new_rv)
        return new_rv

    def _typed(self, obj: Obj) -> Obj:
        """The object with its apiVersion and kind: the API server leaves them out of the
        items of a list of built-in resources, and owner references and Events need them."""
        if not obj.get("apiVersion") or not obj.get("kind"):
            obj = {**obj, "apiVersion": self.resource.api_version, "kind": self.resource.kind}
        return obj if self.store.transform is None else self.store.transform(obj)

    def _notify(self, old: Obj | None, new: Obj | None) -> None:
        for handler in self._handlers:
            try:
                handler(old, new)
            except Exception:  # a broken handler must not stop the cache
                log.exception("informer handler failed")
