"""Where one ask of an attempt goes: a capacity source, and for a gang with a required
topology, one domain of its level.

An attempt asks its sources in order (spec.capacitySources, InOrder). A gang that must sit
inside one domain of a topology level (Kueue's ``podset-required-topology`` on every
constrained pod set naming one level, or a PodGroup's topology) asks inside one domain: the
request's pod templates carry the domain's label, so the autoscaler cannot deliver across two
racks. The domains are those the nodes that exist show for the level (among the nodes the
source's labels select), ranked: reserved nodes there first (not cordoned), then a domain
with a node not cordoned before one cordoned whole, then the members that would place there
now, then by name. When the domain cannot deliver, the next domain of the same
source is asked, as a source is left for the next; then the next source, its domains ranked
afresh. A gang whose level no node shows asks without a domain (as before).

Each ask records its place on its request (source, domain, the domains of the source tried
before it), so the next place follows from the record and the cluster as it is now.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gangcheck.logic.attempt.fulfillment import (
    ClusterView,
    GangSpec,
    fits_now,
    placeable_by_domain,
)
from gangcheck.logic.attempt.records import Record, count_of
from gangcheck.model.names import (
    DOMAIN_ANNOTATION,
    DOMAINS_TRIED_ANNOTATION,
    RACED_ANNOTATION,
    SOURCE_ANNOTATION,
)
from gangcheck.model.objects import Obj, ProvisioningRequest
from gangcheck.model.provisioning_config import AtomicProvisioningSpec

GangOf = Callable[[int], GangSpec]
"""The gang as capacity source `index` would be asked for it (pinned to its node labels)."""


@dataclass(frozen=True)
class Place:
    """One ask's place: a capacity source, and a topology domain (key, value) or none."""

    source: int = 0
    domain: tuple[str, str] | None = None
    tried: tuple[str, ...] = ()
    """Domains of this source asked before this one, in this attempt."""
    raced: tuple[int, ...] = ()
    """Race, an ask in place of a racer that could not deliver: the sources its attempt had
    asked when it was made, its own too (indexes in the config it is made under; race.py)."""

    def record(self) -> dict[str, str]:
        """The annotations recording this place on its request (none for the first source
        asked without a domain: a record from before places existed reads the same)."""
        out: dict[str, str] = {}
        if self.source:
            out[SOURCE_ANNOTATION] = str(self.source)
        if self.domain is not None:
            out[DOMAIN_ANNOTATION] = f"{self.domain[0]}={self.domain[1]}"
        if self.tried:
            out[DOMAINS_TRIED_ANNOTATION] = ",".join(self.tried)
        if self.raced:
            out[RACED_ANNOTATION] = ",".join(map(str, self.raced))
        return out

    def labels(self) -> dict[str, str]:
        return dict([self.domain]) if self.domain is not None else {}

    def describe(self, config: AtomicProvisioningSpec) -> str:
        """How messages name the place, when there is a choice to name."""
        sources = config.sources()
        parts = []
        if len(sources) > 1 and self.source < len(sources):
            source = sources[self.source]
            parts.append(f"capacity source {source.name!r} ({self.source + 1} of {len(sources)})")
        if self.domain is not None:
            parts.append(f"topology domain {self.domain[0]}={self.domain[1]}")
        return " in ".join(reversed(parts)) if parts else ""


def place_of(record: Record, annotations: Mapping[str, str]) -> Place:
    """The place an ask recorded on its request."""
    raw = annotations.get(DOMAIN_ANNOTATION, "")
    key, sep, value = raw.partition("=")
    # every value, the empty one too (a label value a domain may have); only a place with a
    # domain tried writes the record, so one absent is none tried
    recorded = annotations.get(DOMAINS_TRIED_ANNOTATION)
    tried = tuple(recorded.split(",")) if recorded is not None else ()
    raced = annotations.get(RACED_ANNOTATION, "").split(",")
    indexes = tuple(i for i in (count_of(r) for r in raced) if i is not None)
    return Place(record.source, (key, value) if sep and key else None, tried, indexes)


def of_request(req: ProvisioningRequest) -> Place:
    """The place a request's ask recorded."""
    return place_of(Record.of(req.annotations), req.annotations)


def level_of(gang: GangSpec) -> str | None:
    """The level the whole ask sits inside: a PodGroup's topology, or the one level every
    constrained pod set of a Workload names; None when there is none (or several)."""
    if gang.together:
        return gang.together
    levels = set(gang.topology.values())
    return levels.pop() if len(levels) == 1 else None


def pinned(gang: GangSpec, labels: Mapping[str, str], domain: tuple[str, str] | None) -> GangSpec:
    """The gang's templates carrying a source's node labels, and its domain's label on the
    pod sets the domain constrains (all of a PodGroup's)."""
    if not labels and domain is None:
        return gang
    constrained = set(gang.topology) if not gang.together else {n for n, _, _ in gang.pod_sets}
    pod_sets = tuple(
        (
            name,
            count,
            with_labels(
                tpl, {**labels, **(dict([domain]) if domain and name in constrained else {})}
            ),
        )
        for name, count, tpl in gang.pod_sets
    )
    return replace(gang, pod_sets=pod_sets)


def asked_pins(gang: GangSpec, place: Place) -> dict[str, tuple[str, str]]:
    """The pins of a delivery trusted without a fit (TrustProvisioned): the domain the ask was
    scoped to, on each pod set it constrains (every pod set for a gang kept together); none
    for an ask without a domain."""
    if place.domain is None:
        return {}
    if gang.together:
        return {name: place.domain for name, _, _ in gang.pod_sets}
    return {name: place.domain for name, level in gang.topology.items() if level == place.domain[0]}


def with_labels(template: Obj, labels: Mapping[str, str]) -> Obj:
    """A pod template whose node selector also requires `labels`."""
    if not labels:
        return template
    spec = dict(template.get("spec") or {})
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **labels}
    return {**template, "spec": spec}


@dataclass(frozen=True)
class Ranked:
    """A domain of the level, with what ranks it."""

    value: str
    reserved: int
    placeable: int = field(compare=False)


def ranked_domains(
    gang: GangSpec, capacity: ClusterView | None, reserved_labels: Sequence[Mapping[str, str]]
) -> list[str]:
    """The domains of the gang's level the nodes that exist show (among those its node
    selector admits), best first: most reserved nodes not cordoned, then a domain with a node
    not cordoned before one cordoned whole (drained: asked last, not left out), then most
    members placeable there now, then by name. Empty when the gang has no level or no node
    shows it."""
    level = level_of(gang)
    if level is None or capacity is None or not gang.pod_sets:
        return []
    selector = (gang.pod_sets[0][2].get("spec") or {}).get("nodeSelector") or {}
    selector = {k: v for k, v in selector.items() if k != level}
    values: dict[str, int] = {}
    uncordoned: set[str] = set()
    for node in capacity.nodes:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if level not in labels or any(labels.get(k) != v for k, v in selector.items()):
            continue
        value = labels[level]
        values.setdefault(value, 0)
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        uncordoned.add(value)
        reserved = any(all(labels.get(k) == v for k, v in r.items()) for r in reserved_labels)
        values[value] += int(reserved)
    placeable = placeable_by_domain(capacity, gang, level, values)
    if placeable is None:  # a pod set free of the level: each domain's fit reads every node
        placeable = {
            value: fits_now(capacity, pinned(gang, {}, (level, value))).placeable
            for value in values
        }
    ranked = [Ranked(value, reserved, placeable[value]) for value, reserved in values.items()]
    ranked.sort(key=lambda r: (-r.reserved, r.value not in uncordoned, -r.placeable, r.value))
    return [r.value for r in ranked]


def first_place(
    config: AtomicProvisioningSpec, gang_of: GangOf, capacity: ClusterView | None
) -> Place:
    """Where an attempt asks first: its first source, in its best domain."""
    return _in_source(config, 0, gang_of, capacity, ()) or Place(0)


def next_place(
    config: AtomicProvisioningSpec, place: Place, gang_of: GangOf, capacity: ClusterView | None
) -> Place | None:
    """Where to ask after `place` could not deliver: the next domain of its source not tried
    yet, else the next source (in its best domain); None when nothing is left."""
    if place.domain is not None:
        tried = (*place.tried, place.domain[1])
        again = _in_source(config, place.source, gang_of, capacity, tried)
        if again is not None and again.domain is not None:
            return again
    for index in range(place.source + 1, len(config.sources())):
        found = _in_source(config, index, gang_of, capacity, ())
        if found is not None:
            return found
    return None


def _in_source(
    config: AtomicProvisioningSpec,
    index: int,
    gang_of: GangOf,
    capacity: ClusterView | None,
    tried: tuple[str, ...],
) -> Place | None:
    """Source `index` in its best domain not tried; without a domain when its gang has no
    level or no node shows one; None when its domains are all tried."""
    if config.source(index) is None:
        return None
    gang = gang_of(index)
    level = level_of(gang)
    reserved = [dict(r.node_labels) for r in config.reservations]
    domains = ranked_domains(gang, capacity, reserved)
    if level is None or not domains:
        return None if tried else Place(index)
    left = [d for d in domains if d not in tried]
    return Place(index, (level, left[0]), tried) if left else None
