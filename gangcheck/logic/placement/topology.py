"""A required topology: every member of a pod set inside one domain of a level.

A level is a node label key (Kueue's ``kueue.x-k8s.io/podset-required-topology`` annotation
holds it; so does a PodGroup's ``schedulingConstraints.topology[].key``); a domain is one value
of that label. A pod set with a required level fits only if all its members fit on nodes
sharing one value, and the chosen value is what podSetUpdates (or the released pods) pin.

The search is greedy and deterministic: constrained pod sets are taken in the order given;
each is pinned to the first domain (by name) in which it places whole together with the pod
sets pinned before it. It never reports a placement that is not feasible; with two or more
constrained pod sets it may miss a combination that is. A level no node carries at all
(`MissingLevel`: a label the nodes delivered lack) is said as such, with the fit without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gangcheck.logic.placement.dra import Inventory
from gangcheck.logic.placement.fit import (
    Bound,
    BoundUsage,
    FitResult,
    GangPodSet,
    NodeView,
    fit_gang,
    summarize,
)


@dataclass(frozen=True)
class MissingLevel:
    """A required topology level that no node the fit was given carries: there is no domain
    to keep the pod set (or the whole gang) in, whatever room the nodes have."""

    key: str
    pod_set: str = ""
    """The constrained pod set; "" for the whole gang (a PodGroup's topology)."""

    def words(self, arrived: int = 0) -> str:
        """The one line saying so; `arrived`: how many of those nodes arrived for the attempt
        whose fit this is (they are named as such: the autoscaler delivered, unlabelled)."""
        which = f" (pod set {self.pod_set})" if self.pod_set else ""
        level = f"the required topology level {self.key}{which}: the gang cannot fit in one domain"
        if not arrived:
            return f"no node the gang may use carries {level}"
        nodes = f"{arrived} node{'' if arrived == 1 else 's'}"
        return f"{nodes} arrived for this attempt; none carries {level}"


@dataclass(frozen=True)
class TopologyFit:
    """The fit with every constrained pod set pinned, and the pins: pod set -> (key, value)."""

    result: FitResult
    domains: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    problem: str = ""
    """Set when a constrained pod set fits in no single domain: which, and the best try."""
    missing: MissingLevel | None = None
    """Set when the reason is that no node carries the level at all (`problem` then says it,
    and `result` is the fit without that level)."""

    @property
    def fits(self) -> bool:
        return self.result.fits and not self.problem

    def summary(self, arrived: int = 0) -> str:
        """The fit in one line; `arrived`: the nodes among those given that arrived for the
        attempt (said when no node carries a required level)."""
        text = summarize(self.result)
        if self.missing is not None:
            return f"{self.missing.words(arrived)}; ignoring the level, {text}"
        if self.problem:
            return f"{self.problem}; {text}"
        pins = ", ".join(f"{ps} in {k}={v}" for ps, (k, v) in sorted(self.domains.items()))
        return f"{text} ({pins})" if pins and self.result.fits else text


def pinned(pod_set: GangPodSet, key: str, value: str) -> GangPodSet:
    """The pod set with its members restricted to nodes labelled `key=value`."""
    member = pod_set.member
    selector = {**member.node_selector, key: value}
    return replace(pod_set, member=replace(member, node_selector=selector))


def domains_of(nodes: Iterable[NodeView], key: str) -> list[str]:
    """The values of `key` among usable nodes, by name."""
    return sorted({n.labels[key] for n in nodes if n.is_usable and key in n.labels})


def by_domain(nodes: Iterable[NodeView], key: str) -> dict[str, list[NodeView]]:
    """The usable nodes carrying `key`, grouped by its value, each domain's by name: the only
    nodes a member pinned to that domain may take (a fit never places one on a node not
    usable), so a domain's fit on them places what it places on every node."""
    level: dict[str, list[NodeView]] = {}
    for view in nodes:
        if view.is_usable and key in view.labels:
            level.setdefault(view.labels[key], []).append(view)
    for views in level.values():
        views.sort(key=lambda view: view.name)
    return level


def _lacking(nodes: Sequence[NodeView], key: str, pod_set: str = "") -> MissingLevel | None:
    """The level as missing when no node carries it; None when some do (none usable)."""
    return None if any(key in n.labels for n in nodes) else MissingLevel(key, pod_set)


def fit_in_domains(
    gang: Sequence[GangPodSet],
    nodes: Sequence[NodeView],
    bound_pods: Bound = (),
    required: Mapping[str, str] | None = None,
    *,
    together: str = "",
    devices: Inventory | None = None,
) -> TopologyFit:
    """Fit the gang with each pod set named in `required` (pod set -> level key) kept inside
    one domain of its level; with `together` (a level key), the whole gang in one domain."""
    bound = bound_pods if isinstance(bound_pods, BoundUsage) else list(bound_pods)
    if together:
        return _fit_together(gang, nodes, bound, together, devices)
    required = {ps.name: required[ps.name] for ps in gang if required and ps.name in required}
    if not required:
        return TopologyFit(fit_gang(gang, nodes, bound, devices))
    chosen: dict[str, tuple[str, str]] = {}
    domains = _Domains(nodes)
    for ps in gang:
        key = required.get(ps.name)
        if key is None or ps.count == 0:
            continue
        best: tuple[int, str] | None = None
        for value in _values(ps, nodes, key):
            pins = {**chosen, ps.name: (key, value)}
            trial = _apply(pins, gang)
            result = fit_gang(trial, domains.within(pins, gang), bound, devices)
            left = result.unplaced.get(ps.name, 0)
            if left == 0:
                chosen[ps.name] = (key, value)
                break
            if best is None or ps.count - left > best[0]:
                best = (ps.count - left, value)
        else:
            missing = None if best else _lacking(nodes, key, ps.name)
            where = (
                f"; best {key}={best[1]} places {best[0]}" if best else ": no usable node has it"
            )
            problem = f"pod set {ps.name} needs all {ps.count} members in one {key} domain{where}"
            pins = {**chosen, ps.name: (key, best[1])} if best else chosen
            result = fit_gang(_apply(pins, gang), nodes, bound, devices)
            if missing is not None:
                return TopologyFit(result, chosen, missing.words(), missing)
            return TopologyFit(result, chosen, problem)
    return TopologyFit(fit_gang(_apply(chosen, gang), nodes, bound, devices), chosen)


def _values(pod_set: GangPodSet, nodes: Sequence[NodeView], key: str) -> list[str]:
    """The domains a pod set may take: the one its node selector already names (an ask
    scoped to one domain), else every domain of the level."""
    named = pod_set.member.node_selector.get(key)
    return [named] if named is not None else domains_of(nodes, key)


def _apply(pins: Mapping[str, tuple[str, str]], gang: Sequence[GangPodSet]) -> list[GangPodSet]:
    return [pinned(ps, *pins[ps.name]) if ps.name in pins else ps for ps in gang]


def _fit_together(
    gang: Sequence[GangPodSet],
    nodes: Sequence[NodeView],
    bound: Bound,
    key: str,
    devices: Inventory | None,
) -> TopologyFit:
    """The whole gang in the first domain of `key` (by name) that takes it all."""
    best: tuple[FitResult, str] | None = None
    chosen = {ps.member.node_selector[key] for ps in gang if key in ps.member.node_selector}
    values = sorted(chosen) if chosen else domains_of(nodes, key)
    domains = _Domains(nodes)
    for value in values:
        within = domains.of(key, value)  # the only nodes a member pinned there may take
        result = fit_gang([pinned(ps, key, value) for ps in gang], within, bound, devices)
        pins = {ps.name: (key, value) for ps in gang}
        if result.fits:  # the fit over every node: its words name them all, as before
            return TopologyFit(fit_gang(_apply(pins, gang), nodes, bound, devices), pins)
        if best is None or result.placeable > best[0].placeable:
            best = (result, value)
    total = sum(ps.count for ps in gang)
    if best is None:
        missing = _lacking(nodes, key)
        if missing is not None:
            return TopologyFit(
                fit_gang(gang, nodes, bound, devices), problem=missing.words(), missing=missing
            )
        return TopologyFit(
            fit_gang(gang, [], bound),
            problem=f"all {total} members need one {key} domain: no usable node has it",
        )
    result, value = best
    problem = (
        f"all {total} members need one {key} domain; best {key}={value} places {result.placeable}"
    )
    everywhere = fit_gang([pinned(ps, key, value) for ps in gang], nodes, bound, devices)
    return TopologyFit(everywhere, problem=problem)


class _Domains:
    """The nodes of each domain, grouped once per level, so that a try of one domain reads
    its nodes alone. A tenant chooses the level (a PodGroup's topology key, a Job template's
    required-topology annotation): ``kubernetes.io/hostname`` has one domain per node, and a
    try reading every node made a gang fitting no single node cost nodes² reads a look, the
    controller's one event loop blocked meanwhile (over 20 s at 2000 nodes)."""

    def __init__(self, nodes: Sequence[NodeView]) -> None:
        self._nodes = nodes
        self._levels: dict[str, dict[str, list[NodeView]]] = {}

    def of(self, key: str, value: str) -> list[NodeView]:
        """The usable nodes labelled `key=value`, by name."""
        level = self._levels.get(key)
        if level is None:
            level = self._levels[key] = by_domain(self._nodes, key)
        return level.get(value, [])

    def within(
        self, pins: Mapping[str, tuple[str, str]], gang: Sequence[GangPodSet]
    ) -> Sequence[NodeView]:
        """The nodes a try with these pins has to read: with every pod set that has members
        pinned, those of their domains (no other node may take a member: placement there is
        the placement on all nodes); else every node."""
        if any(ps.count > 0 and ps.name not in pins for ps in gang):
            return self._nodes
        wanted = {pins[ps.name] for ps in gang if ps.count > 0}
        found = {view.name: view for key, value in wanted for view in self.of(key, value)}
        return [found[name] for name in sorted(found)]
