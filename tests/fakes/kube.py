"""A fake of the `Kube` interface: an in-memory API server for reconciler tests.

Objects are kept by resource, namespace and name, each write moving one resourceVersion
counter on, as the API server does. It answers like the server where gangcheck relies on it:
404 naming the object, 409 AlreadyExists on a taken name, 409 Conflict on a stale
resourceVersion (in a merge patch's metadata, a PUT's body or a delete's preconditions), 422
on a failed JSON-patch ``test`` and on a name that is missing; ``generateName``; status kept
apart from the rest (a write to the object leaves its status, a write to ``status`` changes
only the status). Every write is recorded (`writes`), and any call can be made to fail on
demand (`fail`), before it takes effect or, like an answer lost on the way back, after.

`caches()` builds the controller's caches from the store (no list, no watch): a test reads
what the reconcilers read, and `sync` refreshes them after the test itself changes objects
(playing the autoscaler, the scheduler or a person).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gangcheck.kube import resources
from gangcheck.kube.client import Kube
from gangcheck.kube.errors import (
    ApiError,
    InvalidError,
    ReplacedError,
    error_from_status,
    unapplied,
)
from gangcheck.kube.informer import Informer
from gangcheck.kube.resources import Resource
from gangcheck.model.objects import Obj
from gangcheck.reconcile.caches import Caches

Key = tuple[str, str, str, str]
"""(group, plural, namespace, name): versions of one resource share their objects."""

WRITES = frozenset({"create", "update", "patch", "delete"})
KNOWN: tuple[Resource, ...] = tuple(r for r in vars(resources).values() if isinstance(r, Resource))
_REASONS = {
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Gone",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


@dataclass(frozen=True)
class Call:
    """One call the code made: verb (get, list, create, update, patch, delete), the kind, the
    object's name and namespace, what was sent, and the subresource written, if any."""

    verb: str
    kind: str
    name: str = ""
    namespace: str = ""
    body: Any = None
    subresource: str = ""
    patch_type: str = ""
    """"merge" or "json" for a patch."""


@dataclass
class _Failure:
    verb: str
    kind: str
    name: str | None
    error: ApiError
    times: int
    applied: bool

    def matches(self, call: Call) -> bool:
        return (
            self.times > 0
            and self.verb in (call.verb, "*")
            and self.kind in (call.kind, "*")
            and self.name in (None, call.name)
        )


def api_error(status: int, *, reason: str = "", name: str = "", kind: str = "") -> ApiError:
    """The error the client raises for this answer of the server (a Status body, as sent)."""
    reason = reason or _REASONS.get(status, str(status))
    status_body = {
        "kind": "Status",
        "status": "Failure",
        "reason": reason,
        "message": f"{kind} {name!r}: {reason}".strip(),
        "code": status,
        "details": {"name": name, "kind": kind} if name else {},
    }
    return error_from_status(status, json.dumps(status_body), target=f"{kind}/{name}")


class FakeKube(Kube):
    """An in-memory API server behind the `Kube` interface (see the module docstring)."""

    def __init__(self, *, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        super().__init__(None)
        self.clock = clock
        self.calls: list[Call] = []
        """Every call made, in order, failed ones included."""
        self.last_rv = 0
        self._objects: dict[Key, Obj] = {}
        self._rv = itertools.count(100)
        self._ids = itertools.count(1)
        self._failures: list[_Failure] = []

    # ---- the test's side -----------------------------------------------------------------

    def add(self, *objs: Obj) -> None:
        """Put objects in the store as they are (no call recorded); each gets a
        resourceVersion, and a uid and creationTimestamp when it has none."""
        for obj in objs:
            res = resource_of(obj)
            stored = self._complete(res, copy.deepcopy(obj), obj["metadata"].get("namespace"))
            self._objects[_key(res, stored)] = stored

    def remove(self, res: Resource, name: str, namespace: str | None = None) -> None:
        self._objects.pop(_key_of(res, name, namespace), None)

    def stored(self, res: Resource, name: str, namespace: str | None = None) -> Obj | None:
        """The object as the server has it now (a copy), or None."""
        found = self._objects.get(_key_of(res, name, namespace))
        return copy.deepcopy(found) if found is not None else None

    def all_of(self, res: Resource) -> list[Obj]:
        return [copy.deepcopy(o) for k, o in self._objects.items() if k[:2] == _kind_key(res)]

    def fail(
        self,
        verb: str,
        kind: str,
        name: str | None = None,
        error: ApiError | int = 500,
        *,
        times: int = 1,
        applied: bool = False,
    ) -> None:
        """Make the next `times` calls of `verb` on `kind` (and `name`, if given; "*" for any
        verb or kind) raise `error` (a status code, or the error itself). With `applied` the
        call takes effect first: an answer lost on its way back."""
        if isinstance(error, int):
            error = api_error(error, name=name or "", kind=kind)
        self._failures.append(_Failure(verb, kind, name, error, times, applied))

    def mend(self, verb: str, kind: str, name: str | None = None) -> None:
        """Let the calls `fail` was told to fail with these same arguments through again,
        however many `times` were left (a CRD or an RBAC rule back)."""
        told = (verb, kind, name)
        self._failures = [f for f in self._failures if (f.verb, f.kind, f.name) != told]

    @property
    def writes(self) -> list[Call]:
        return [c for c in self.calls if c.verb in WRITES]

    def writes_of(self, kind: str, verb: str | None = None) -> list[Call]:
        return [w for w in self.writes if w.kind == kind and verb in (None, w.verb)]

    def caches(self, *pod_groups: Resource) -> Caches:
        """The controller's caches, filled from the store, with an informer for each PodGroup
        resource given."""
        caches = Caches.create(self)
        for res in pod_groups:
            caches.pod_groups[res.group] = Informer(self, res)
        caches.pod_groups_discovered = True  # as discovery answered: these APIs are served
        self.sync(caches)
        return caches

    def sync(self, caches: Caches) -> None:
        """Make every cache show the store as it is now (as a relist would), synced and
        authoritative."""
        for informer in [*caches.all(), *caches.pod_groups.values()]:
            # The same Store, emptied and refilled, so that what the caches index from its
            # changes (kept capacity, open requests) follows, as after a relist.
            for obj in list(informer.store):
                informer.store._pop(obj)
            for obj in self._matching(informer.resource, None, informer._selector):
                informer.store.put_if_newer(copy.deepcopy(obj))
            informer.served = informer.authoritative = True
            informer._stale_since = None  # listed: current (kube/informer.py)
            informer.synced.set()

    # ---- the code's side: the verbs of Kube ------------------------------------------------

    @property
    def host(self) -> str:
        return "fake"

    def fenced(self, fence: Any) -> Kube:
        return self

    async def close(self) -> None:
        return None

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> Obj:
        call = Call("get", res.kind, name, namespace or "")
        with self._answering(call):
            return copy.deepcopy(self._existing(res, name, namespace))

    async def list_objects(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Obj:
        with self._answering(Call("list", res.kind, "", namespace or "")):
            items = self._matching(res, namespace, label_selector, field_selector)
        return {
            "apiVersion": res.api_version,
            "kind": f"{res.kind}List",
            "metadata": {"resourceVersion": str(self.last_rv)},
            "items": items,
        }

    async def create(self, res: Resource, body: Obj, namespace: str | None = None) -> Obj:
        ns = namespace or body.get("metadata", {}).get("namespace")
        call = Call("create", res.kind, body["metadata"].get("name", ""), ns or "", body)
        with self._answering(call):
            return self._create(res, body, ns)

    async def replace(self, res: Resource, body: Obj, *, subresource: str | None = None) -> Obj:
        meta = body["metadata"]
        ns = meta.get("namespace", "")
        call = Call("update", res.kind, meta["name"], ns, body, subresource or "")
        with self._answering(call):
            current = self._existing(res, meta["name"], meta.get("namespace"))
            self._check_rv(res, current, meta.get("resourceVersion"))
            return self._store(res, current, copy.deepcopy(body), subresource)

    async def merge_patch(
        self,
        res: Resource,
        name: str,
        patch: Obj,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        uid: str | None = None,
    ) -> Obj:
        call = Call("patch", res.kind, name, namespace or "", patch, subresource or "", "merge")
        with self._answering(call):
            current = self._existing(res, name, namespace)
            if uid and current["metadata"].get("uid") != uid:  # made again: as the client says
                raise ReplacedError(409, "Conflict", "uid mismatch", target=f"{res.kind}/{name}")
            self._check_rv(res, current, (patch.get("metadata") or {}).get("resourceVersion"))
            return self._store(res, current, merged(current, patch), subresource)

    async def json_patch(
        self,
        res: Resource,
        name: str,
        ops: list[Obj],
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> Obj:
        call = Call("patch", res.kind, name, namespace or "", ops, subresource or "", "json")
        try:
            with self._answering(call):
                current = self._existing(res, name, namespace)
                try:
                    patched = json_patched(current, ops)
                except ValueError as e:
                    raise api_error(422, name=name, kind=res.kind) from e
                return self._store(res, current, patched, subresource)
        except InvalidError as e:  # kube-apiserver's 422, failed or faulted: as Kube reads it
            raise unapplied(e, f"{res.kind}/{name}") from e

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        uid: str | None = None,
        grace_period_seconds: int | None = None,
    ) -> Obj:
        preconditions = {"resourceVersion": resource_version, "uid": uid}
        call = Call("delete", res.kind, name, namespace or "", preconditions)
        with self._answering(call):
            return self._delete(res, name, namespace, resource_version, uid)

    async def watch(self, res: Resource, *args: Any, **kwargs: Any) -> AsyncGenerator[Obj]:
        raise NotImplementedError("the fake has no watch: fill caches with caches() and sync()")
        yield {}  # pragma: no cover

    async def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        raise NotImplementedError(f"the fake answers the verbs of Kube, not {method} {path}")

    # ---- plumbing ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _answering(self, call: Call) -> Iterator[None]:
        """Record the call; raise an injected failure before it, or (applied) after it."""
        self.calls.append(call)
        failure = next((f for f in self._failures if f.matches(call)), None)
        if failure is not None:
            failure.times -= 1
            if not failure.applied:
                raise failure.error
        yield
        if failure is not None and failure.applied:
            raise failure.error

    def _next_rv(self) -> str:
        self.last_rv = next(self._rv)
        return str(self.last_rv)

    def _complete(self, res: Resource, obj: Obj, namespace: str | None) -> Obj:
        meta = obj.setdefault("metadata", {})
        obj.setdefault("apiVersion", res.api_version)
        obj.setdefault("kind", res.kind)
        if res.namespaced and namespace:
            meta["namespace"] = namespace
        meta.setdefault("uid", f"uid-{next(self._ids):04d}")
        meta.setdefault("creationTimestamp", self.clock().strftime("%Y-%m-%dT%H:%M:%SZ"))
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = self._next_rv()
        return obj

    def _existing(self, res: Resource, name: str, namespace: str | None) -> Obj:
        found = self._objects.get(_key_of(res, name, namespace))
        if found is None:
            raise api_error(404, name=name, kind=res.plural)
        return found

    def _create(self, res: Resource, body: Obj, namespace: str | None) -> Obj:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{next(self._ids):05x}"
        if not meta.get("name") or (res.namespaced and not namespace):
            raise api_error(422, name=meta.get("name", ""), kind=res.kind)
        if _key_of(res, meta["name"], namespace) in self._objects:
            raise api_error(409, reason="AlreadyExists", name=meta["name"], kind=res.plural)
        for server_owned in ("uid", "creationTimestamp", "generation", "deletionTimestamp"):
            meta.pop(server_owned, None)
        stored = self._complete(res, obj, namespace)
        self._objects[_key(res, stored)] = stored
        return copy.deepcopy(stored)

    def _check_rv(self, res: Resource, current: Obj, wanted: str | None) -> None:
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise api_error(409, name=current["metadata"]["name"], kind=res.plural)

    def _store(self, res: Resource, current: Obj, new: Obj, subresource: str | None) -> Obj:
        """Keep the status apart: a write to `status` changes only it, any other write all
        but it; identity fields stay the server's; the generation moves with the spec."""
        if subresource == "status":
            new = {**copy.deepcopy(current), "status": new.get("status")}
        elif "status" in current:
            new = {**new, "status": copy.deepcopy(current["status"])}
        meta, old_meta = new["metadata"], current["metadata"]
        for kept in ("name", "namespace", "uid", "creationTimestamp"):
            if kept in old_meta:
                meta[kept] = old_meta[kept]
        if new.get("spec") != current.get("spec"):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        meta["resourceVersion"] = self._next_rv()
        self._objects[_key(res, new)] = new
        return copy.deepcopy(new)

    def _delete(
        self, res: Resource, name: str, namespace: str | None, rv: str | None, uid: str | None
    ) -> Obj:
        current = self._existing(res, name, namespace)
        if uid and uid != current["metadata"].get("uid"):
            raise api_error(409, name=name, kind=res.plural)
        self._check_rv(res, current, rv)
        if current["metadata"].get("finalizers"):
            marked = merged(current, {"metadata": {"deletionTimestamp": _now(self)}})
            return self._store(res, current, marked, None)
        del self._objects[_key_of(res, name, namespace)]
        self._next_rv()
        return {"kind": "Status", "status": "Success"}

    def _matching(
        self,
        res: Resource,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        return [
            copy.deepcopy(o)
            for k, o in sorted(self._objects.items())
            if k[:2] == _kind_key(res)
            and (not namespace or k[2] == namespace)
            and selects(label_selector, (o["metadata"].get("labels") or {}))
            and fields_select(field_selector, o)
        ]


# ---- resources and keys --------------------------------------------------------------------


def resource_of(obj: Obj) -> Resource:
    """The known resource of an object, by its apiVersion and kind."""
    for res in KNOWN:
        if (res.api_version, res.kind) == (obj.get("apiVersion"), obj.get("kind")):
            return res
    raise KeyError(f"no known resource for {obj.get('apiVersion')} {obj.get('kind')}")


def _kind_key(res: Resource) -> tuple[str, str]:
    return res.group, res.plural


def _key_of(res: Resource, name: str, namespace: str | None) -> Key:
    return res.group, res.plural, (namespace or "") if res.namespaced else "", name


def _key(res: Resource, obj: Obj) -> Key:
    meta = obj["metadata"]
    return _key_of(res, meta["name"], meta.get("namespace"))


def _now(kube: FakeKube) -> str:
    return str(kube.clock().strftime("%Y-%m-%dT%H:%M:%SZ"))


# ---- selectors and patches -----------------------------------------------------------------


def selects(selector: str | None, labels: dict[str, str]) -> bool:
    """An equality-based label selector: `k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-joined."""
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            ok = labels.get(key) != value
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            ok = labels.get(key) == value
        elif term.startswith("!"):
            ok = term[1:] not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True


def fields_select(selector: str | None, obj: Obj) -> bool:
    """A field selector of `path.to.field=value` terms (what gangcheck lists pods by)."""
    for term in filter(None, (selector or "").split(",")):
        path, value = term.split("=", 1)
        found: Any = obj
        for part in path.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        if str(found or "") != value:
            return False
    return True


def merged(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge, null removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(out.get(key), value)
    return out


def json_patched(target: Obj, ops: list[Obj]) -> Obj:
    """RFC 6902 JSON patch (test, add, remove, replace); ValueError on a failed op."""
    doc = copy.deepcopy(target)
    for op in ops:
        *parents, last = _pointer(op["path"])
        holder: Any = doc
        for part in parents:
            holder = holder[int(part)] if isinstance(holder, list) else holder.get(part)
            if holder is None:
                raise ValueError(f"no {op['path']}")
        _apply_op(holder, last, op)
    return doc


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def _apply_op(holder: Any, last: str, op: Obj) -> None:
    kind = op["op"]
    if isinstance(holder, list):
        index = len(holder) if last == "-" else int(last)
        if kind == "add":
            holder.insert(index, copy.deepcopy(op["value"]))
            return
        if index >= len(holder):
            raise ValueError(f"no {op['path']}")
    elif kind != "add" and last not in holder:
        raise ValueError(f"no {op['path']}")
    if kind == "test":
        if holder[index if isinstance(holder, list) else last] != op["value"]:
            raise ValueError(f"test of {op['path']} failed")
    elif kind == "remove":
        del holder[index if isinstance(holder, list) else last]
    elif kind in ("add", "replace"):
        holder[index if isinstance(holder, list) else last] = copy.deepcopy(op["value"])
    else:
        raise ValueError(f"op {kind} not supported")
