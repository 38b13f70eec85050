"""Per-node capacity kept current from Node and Pod events, instead of recomputed per fit.

A fit needs, per node, its `NodeView` and what the pods bound to it request. Recomputing
those from every cached Node and Pod parses every bound pod's requests on every fit;
`NodeUsage` parses a node when it changes and a pod's requests when the pod changes,
and keeps per-node totals by integer addition and subtraction. What it holds is what
`node_view` of every node and `used_resources` of every pod give (a property test holds it
to that), with one more thing: the nodes by the extended resources they offer, so a fit can
leave out the nodes that could host no member (`BoundUsage.offering`).

And the Karpenter NodeClaims being deleted (`on_node_claim`): the view of a node whose claim
has a deletionTimestamp carries that problem (`node_view`'s `deleting_claim`), as
`deleting_claim_of` the claims at hand says. A claim is a node's when its `status.providerID`
is the Node's `spec.providerID` (what Karpenter itself goes by) or its `status.nodeName` is
the Node's name.

Events are the informer's `(old, new)` pairs: old None on add, new None on delete. Pure:
nothing here reads a clock or the API.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gangcheck.logic.placement.dra import Inventory, build_inventory, with_claims
from gangcheck.logic.placement.fit import (
    STANDARD_RESOURCES,
    BoundUsage,
    NodeView,
    Resources,
    node_room,
    node_view,
    pod_requests,
)
from gangcheck.logic.placement.quantity import QuantityError
from gangcheck.logic.placement.raw import dict_at
from gangcheck.model.objects import ReadOnlyObj as Obj
from gangcheck.model.objects import is_finished


@dataclass(frozen=True)
class _Bound:
    """A pod counted on a node: where, and what it requests."""

    node: str
    requests: Mapping[str, int]


class NodeUsage:
    """Node views and what bound pods use, per node, kept current from events; and, with a
    `tally` annotation, the bound unfinished pods by the value they give it."""

    def __init__(self, *, tally: str = "") -> None:
        self._tally = tally
        self._tallied: dict[tuple[str, str], set[str]] = {}
        self._views: dict[str, tuple[Obj, NodeView]] = {}
        self._by_name: Sequence[NodeView] | None = None
        self._rooms: dict[str, tuple[NodeView, Resources]] = {}
        self._bound: dict[str, _Bound] = {}
        self._used: dict[str, dict[str, int]] = {}
        self._pods_on: dict[str, int] = {}
        self._offering: dict[str, set[str]] = {}
        self._malformed: dict[str, str] = {}
        self._deleting: dict[str, _Link] = {}
        """The NodeClaims being deleted, by name, and the node each names."""
        self._deleting_by: dict[str, set[str]] = {}
        """The deleting claims by what they name: `node:<name>`, `provider:<id>`."""
        self._providers: dict[str, str] = {}
        """The kept nodes by providerID."""

    # ---- events ----------------------------------------------------------------------

    def on_node(self, old: Obj | None, new: Obj | None) -> None:
        """A Node added, changed or deleted: its view and the offering index follow."""
        self._by_name = None
        if old is not None:
            self._drop_node(_name(old))
            self._rooms.pop(_name(old), None)  # kept for that view only: a new one has none
            if self._providers.get(_provider(old)) == _name(old):
                del self._providers[_provider(old)]
        if new is not None:
            view = node_view(new, deleting_claim=self.deleting_claim_of(new))
            self._views[view.name] = (new, view)
            if _provider(new):
                self._providers[_provider(new)] = view.name
            for resource in _extended(view):
                self._offering.setdefault(resource, set()).add(view.name)

    def on_node_claim(self, old: Obj | None, new: Obj | None) -> None:
        """A Karpenter NodeClaim added, changed or deleted: when whether it is being deleted,
        or the node it names, changed, the views of the nodes it names (before and after)
        are made again."""
        before, after = _deleting_link(old), _deleting_link(new)
        if before == after:
            return
        if old is not None and before is not None:
            self._forget_claim(_name(old), before)
        if new is not None and after is not None:
            self._deleting[_name(new)] = after
            for key in after.index_keys():
                self._deleting_by.setdefault(key, set()).add(_name(new))
        for name in self._nodes_named(before) | self._nodes_named(after):
            kept = self._views[name][0]
            self.on_node(kept, kept)

    def _forget_claim(self, name: str, link: _Link) -> None:
        if self._deleting.get(name) != link:
            return
        del self._deleting[name]
        for key in link.index_keys():
            claims = self._deleting_by.get(key)
            if claims is not None:
                claims.discard(name)
                if not claims:
                    del self._deleting_by[key]

    def _nodes_named(self, link: _Link | None) -> set[str]:
        """The kept nodes a claim's link names."""
        if link is None:
            return set()
        found = {link.node} if link.node in self._views else set()
        by_provider = self._providers.get(link.provider) if link.provider else None
        return found | ({by_provider} if by_provider else set())

    def deleting_claim_of(self, node: Obj) -> str:
        """The name of a NodeClaim being deleted that is the node's ("" if none; the first
        by name if several), as `deleting_claim_of` the claims told of says."""
        if not self._deleting:
            return ""
        claims: set[str] = set()
        for key in _Link(_name(node), _provider(node)).index_keys():
            claims |= self._deleting_by.get(key, set())
        return min(claims, default="")

    def nodes_of_claim(self, claim: Obj | None) -> list[str]:
        """The kept nodes a NodeClaim is of (by providerID or node name), by name."""
        link = _link(claim) if claim is not None else None
        return sorted(self._nodes_named(link))

    def on_pod(self, old: Obj | None, new: Obj | None) -> None:
        """A Pod added, changed or deleted: its requests are parsed again only if its spec
        or whether it counts (bound, not finished) changed."""
        if old is not None and new is not None and self._same_use(old, new):
            return
        if old is not None:
            self._drop_pod(_key(old), old)
        if new is not None:
            self._add_pod(new)

    # ---- reads -----------------------------------------------------------------------

    def view_of(self, node: Obj) -> NodeView:
        """The node's view: the one kept, if it is of this very node object (or of the same
        resourceVersion of it)."""
        kept = self._views.get(_name(node))
        if kept is not None and (kept[0] is node or _version(kept[0]) == _version(node) != ""):
            return kept[1]
        return node_view(node, deleting_claim=self.deleting_claim_of(node))

    def node_views(self) -> Sequence[NodeView]:
        """The views of every node, as kept, by name (the order fits take them in, kept
        between node events: not to be changed)."""
        if self._by_name is None:
            self._by_name = [self._views[name][1] for name in sorted(self._views)]
        return self._by_name

    def usage(self) -> BoundUsage:
        """What bound pods use per node, and the offering index; QuantityError (as parsing the
        pods would raise) while a bound pod has a malformed request."""
        if self._malformed:
            raise QuantityError(next(iter(self._malformed.values())))
        return BoundUsage(self._used, self._offering, self._views.keys(), self.room_of)

    def room_of(self, view: NodeView) -> Resources:
        """The view's room (`node_room`): kept for the node's kept view until the node or
        what its pods use changes."""
        kept = self._rooms.get(view.name)
        if kept is not None and kept[0] is view:
            return kept[1]
        room = node_room(view, self._used)
        known = self._views.get(view.name)
        if known is not None and known[1] is view:
            self._rooms[view.name] = (view, room)
        return room

    def used(self) -> dict[str, dict[str, int]]:
        """A copy of what bound pods use per node, zero amounts left out."""
        return {
            node: {r: v for r, v in used.items() if v}
            for node, used in self._used.items()
            if any(used.values())
        }

    def views(self) -> dict[str, NodeView]:
        return {name: view for name, (_, view) in self._views.items()}

    def offering(self) -> dict[str, set[str]]:
        return {r: set(nodes) for r, nodes in self._offering.items() if nodes}

    # ---- bookkeeping -------------------------------------------------------------------

    def _same_use(self, old: Obj, new: Obj) -> bool:
        """Whether the pod's change leaves what it uses where it is: same spec, it counts (or
        not) as before, tallied alike. Most pod events are status updates: nothing to parse."""
        return (
            _key(old) == _key(new)
            and _counts(old) == _counts(new)
            and _tally_key(old, self._tally) == _tally_key(new, self._tally)
            and old.get("spec") == new.get("spec")
        )

    def _drop_node(self, name: str) -> None:
        kept = self._views.pop(name, None)
        if kept is None:
            return
        for resource in _extended(kept[1]):
            nodes = self._offering.get(resource)
            if nodes is not None:
                nodes.discard(name)
                if not nodes:
                    del self._offering[resource]

    def tallied(self, namespace: str, value: str) -> int:
        """How many bound, unfinished pods of the namespace give the `tally` annotation this
        value: `tally` from scratch, kept current."""
        return len(self._tallied.get((namespace, value), ()))

    def _add_pod(self, pod: Obj) -> None:
        node = dict_at(pod, "spec").get("nodeName")
        if not node or is_finished(pod):
            return
        key = _key(pod)
        if tallied := _tally_key(pod, self._tally):
            self._tallied.setdefault(tallied, set()).add(key)
        try:
            requests = pod_requests(dict_at(pod, "spec"))
        except QuantityError as e:
            self._malformed[key] = str(e)
            return
        bound = _Bound(str(node), requests)
        self._bound[key] = bound
        self._count(bound, +1)

    def _drop_pod(self, key: str, pod: Obj) -> None:
        if (tallied := _tally_key(pod, self._tally)) and tallied in self._tallied:
            self._tallied[tallied].discard(key)
            if not self._tallied[tallied]:
                del self._tallied[tallied]
        self._malformed.pop(key, None)
        bound = self._bound.pop(key, None)
        if bound is not None:
            self._count(bound, -1)

    def _count(self, bound: _Bound, sign: int) -> None:
        self._rooms.pop(bound.node, None)
        pods = self._pods_on.get(bound.node, 0) + sign
        if pods == 0:
            del self._pods_on[bound.node]
            del self._used[bound.node]
            return
        self._pods_on[bound.node] = pods
        used = self._used.setdefault(bound.node, {})
        for resource, amount in bound.requests.items():
            used[resource] = used.get(resource, 0) + sign * amount


class DeviceInventory:
    """The cluster's DRA inventory, built again only when what it is built of changed: whole
    when a ResourceSlice or DeviceClass changed; when only claims changed, what they hold in
    use, the devices and what was worked out of them (CEL matches) kept. The same inventory
    as `build_inventory` of the objects at hand (a property test holds it to that)."""

    def __init__(self) -> None:
        self._inventory: Inventory | None = None
        self._published_changed = True
        self._claims_changed = True

    def on_published(self, _old: Obj | None, _new: Obj | None) -> None:
        """A ResourceSlice or DeviceClass added, changed or deleted."""
        self._published_changed = True

    def on_claim(self, old: Obj | None, new: Obj | None) -> None:
        """A ResourceClaim added, changed or deleted: only its allocation matters here."""
        if old is None or new is None or dict_at(old, "status") != dict_at(new, "status"):
            self._claims_changed = True

    def inventory(
        self, slices: Iterable[Obj], classes: Iterable[Obj], claims: Iterable[Obj]
    ) -> Inventory:
        """The inventory of these objects (the ones the events told of)."""
        if self._inventory is None or self._published_changed:
            self._inventory = build_inventory(slices, classes, claims)
        elif self._claims_changed:
            self._inventory = with_claims(self._inventory, claims)
        self._published_changed = self._claims_changed = False
        return self._inventory


@dataclass(frozen=True)
class _Link:
    """What a NodeClaim names of its node: the node's name and its providerID (either may be
    empty: a claim not launched or not registered yet)."""

    node: str
    provider: str

    def index_keys(self) -> list[str]:
        return [f"{k}{v}" for k, v in (("node:", self.node), ("provider:", self.provider)) if v]


def _link(claim: Obj) -> _Link:
    status = dict_at(claim, "status")
    return _Link(str(status.get("nodeName") or ""), str(status.get("providerID") or ""))


def _deleting_link(claim: Obj | None) -> _Link | None:
    """What a NodeClaim being deleted names; None when it is not being deleted (or names
    nothing: no node to take out of the count)."""
    if claim is None or not dict_at(claim, "metadata").get("deletionTimestamp"):
        return None
    link = _link(claim)
    return link if link.node or link.provider else None


def deleting_claim_of(node: Obj, claims: Iterable[Obj]) -> str:
    """The name of a Karpenter NodeClaim among `claims` that is the node's and is being
    deleted ("" if none; the first by name if several). A claim is the node's when its
    `status.providerID` is the Node's `spec.providerID`, or its `status.nodeName` the Node's
    name. Karpenter, once a claim is being deleted, deletes its Node (the Node then gets its
    own deletionTimestamp), whose termination then taints it `karpenter.sh/disrupted`: until
    then, only the claim says the node is going."""
    keys = set(_Link(_name(node), _provider(node)).index_keys())
    found = []
    for claim in claims:
        link = _deleting_link(claim)
        if link is not None and keys.intersection(link.index_keys()):
            found.append(_name(claim))
    return min(found, default="")


def node_claim_change_matters(old: Obj | None, new: Obj | None) -> bool:
    """Whether a NodeClaim event can change whether a node is usable: the claim's deletion
    began (or the claim went, being deleted), or a deleting claim came to name another node."""
    return _deleting_link(old) != _deleting_link(new)


def tally(pods: Iterable[Obj], annotation: str, namespace: str, value: str) -> int:
    """How many pods of the namespace that give the annotation this value are bound to a node
    and not finished (a gang's members consuming its request: NodeUsage keeps this
    count current)."""
    return sum(
        1
        for pod in pods
        if _tally_key(pod, annotation) == (namespace, value)
        and dict_at(pod, "spec").get("nodeName")
        and not is_finished(pod)
    )


def _tally_key(pod: Obj, annotation: str) -> tuple[str, str] | None:
    """(namespace, value) the pod gives the annotation; None without one."""
    meta = dict_at(pod, "metadata")
    value = dict_at(meta, "annotations").get(annotation) if annotation else None
    return (str(meta.get("namespace") or ""), str(value)) if value else None


def _counts(pod: Obj) -> bool:
    return not is_finished(pod)


def _extended(view: NodeView) -> list[str]:
    return [r for r, v in view.allocatable.items() if v > 0 and r not in STANDARD_RESOURCES]


def _key(obj: Obj) -> str:
    meta = dict_at(obj, "metadata")
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _name(obj: Obj) -> str:
    return str(dict_at(obj, "metadata").get("name") or "")


def _provider(node: Obj) -> str:
    return str(dict_at(node, "spec").get("providerID") or "")


def _version(obj: Obj) -> str:
    return str(dict_at(obj, "metadata").get("resourceVersion") or "")


def node_facts(node: Obj) -> tuple[object, ...]:
    """What any decision reads of a Node: its labels, annotations, deletion, spec (taints,
    unschedulable), allocatable and capacity, and each condition's type and status. A change
    outside these (a heartbeat's times, images, addresses) can change no decision."""
    meta, status = dict_at(node, "metadata"), dict_at(node, "status")
    conditions = sorted(
        (str(c.get("type", "")), str(c.get("status", "")))
        for c in status.get("conditions") or []
        if isinstance(c, Mapping)
    )
    return (
        dict_at(meta, "labels"),
        dict_at(meta, "annotations"),
        meta.get("deletionTimestamp"),
        dict_at(node, "spec"),
        dict_at(status, "allocatable"),
        dict_at(status, "capacity"),
        conditions,
    )


def node_change_matters(old: Obj | None, new: Obj | None) -> bool:
    """Whether a Node event can change a decision (an add or a delete always can)."""
    return old is None or new is None or node_facts(old) != node_facts(new)


def frees_capacity(old: Obj | None, new: Obj | None) -> bool:
    """Whether a Pod event gives room back on a node: a bound pod unbound, moved, finished
    or gone. A pod newly bound or starting only takes room, which lets no waiting gang fit."""
    was = str(dict_at(old or {}, "spec").get("nodeName") or "")
    if not was or old is None or is_finished(old):
        return False
    if new is None or is_finished(new):
        return True
    return str(dict_at(new, "spec").get("nodeName") or "") != was
