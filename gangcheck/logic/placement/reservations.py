"""Reservation-backed capacity: nodes already paid for, used before asking for new ones.

A reservation names the labels its nodes carry and how many nodes it holds. A node carrying
every one of those labels (and at least one label is named) is one of the reservation's,
up to ``nodes`` of them: the first by name. A node matching several reservations belongs to
the first of them in the order given; a later one counts only nodes not already taken.

A gang is placed on the reserved nodes first (``fit.fit_gang`` restricted to them, with the
pods already bound there taking their room); only the members left over need new capacity.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gangcheck.logic.placement.dra import Inventory
from gangcheck.logic.placement.fit import GangPodSet, NodeView, fit_gang


@dataclass(frozen=True)
class Reservation:
    """Capacity already paid for: up to ``nodes`` nodes carrying all of ``node_labels``."""

    name: str
    node_labels: Mapping[str, str]
    nodes: int

    def matches(self, node: NodeView) -> bool:
        """Whether ``node`` carries every label of the reservation (none named: no node)."""
        return bool(self.node_labels) and all(
            node.labels.get(key) == value for key, value in self.node_labels.items()
        )


@dataclass(frozen=True)
class ReservedSplit:
    """How a gang divides between reserved capacity and capacity still to be requested.

    ``on_reserved``: members per pod set placed on reserved nodes; ``remainder``: members per
    pod set still needing new capacity; ``by_reservation``: members per reservation. Only
    positive counts appear. ``placements``: reserved node -> pod set name per member there.
    """

    on_reserved: dict[str, int] = field(default_factory=dict)
    remainder: dict[str, int] = field(default_factory=dict)
    by_reservation: dict[str, int] = field(default_factory=dict)
    placements: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def reserved_members(self) -> int:
        return sum(self.on_reserved.values())

    @property
    def remainder_members(self) -> int:
        return sum(self.remainder.values())

    @property
    def total(self) -> int:
        return self.reserved_members + self.remainder_members


def reserved_nodes(
    reservations: Sequence[Reservation], nodes: Iterable[NodeView]
) -> dict[str, str]:
    """Node name -> name of the reservation the node belongs to (see module doc)."""
    by_name = sorted({node.name: node for node in nodes}.values(), key=lambda n: n.name)
    owner: dict[str, str] = {}
    for reservation in reservations:
        if reservation.nodes <= 0:
            continue
        free = (n for n in by_name if n.name not in owner and reservation.matches(n))
        for _, node in zip(range(reservation.nodes), free, strict=False):
            owner[node.name] = reservation.name
    return owner


def split_gang(
    pod_sets: Sequence[GangPodSet],
    nodes: Sequence[NodeView],
    bound_pods: Iterable[Mapping[str, Any]],
    reservations: Sequence[Reservation],
    devices: Inventory | None = None,
) -> ReservedSplit:
    """Places the gang on the reserved nodes as far as it goes; the rest is the remainder.

    ``bound_pods``: the pods bound to the nodes (any, not finished), whose requests take
    room. ``devices``: the DRA devices, for members with resource claims. When the whole
    gang does not fit on reserved capacity, the placement is ``fit_gang``'s best partial one
    (the most members placed).
    """
    owner = reserved_nodes(reservations, nodes)
    wanted = {ps.name: ps.count for ps in pod_sets if ps.count > 0}
    if not owner or not wanted:
        return ReservedSplit(remainder=wanted)
    result = fit_gang(pod_sets, [n for n in nodes if n.name in owner], bound_pods, devices)
    on_reserved: Counter[str] = Counter()
    by_reservation: Counter[str] = Counter()
    for node_name, members in result.placements.items():
        on_reserved.update(members)
        by_reservation[owner[node_name]] += len(members)
    remainder = {name: count - on_reserved[name] for name, count in wanted.items()}
    return ReservedSplit(
        on_reserved={name: on_reserved[name] for name in wanted if on_reserved[name] > 0},
        remainder={name: count for name, count in remainder.items() if count > 0},
        by_reservation=dict(sorted(by_reservation.items())),
        placements=dict(result.placements),
    )


def describe(split: ReservedSplit) -> str:
    """One line, e.g. ``3 of 4 members on reserved capacity (res-a 3); requesting 1 new``."""
    text = f"{split.reserved_members} of {split.total} members on reserved capacity"
    if split.by_reservation:
        text += " (" + ", ".join(f"{n} {c}" for n, c in split.by_reservation.items()) + ")"
    left = split.remainder_members
    return text + (f"; requesting {left} new" if left else "; nothing new to request")
