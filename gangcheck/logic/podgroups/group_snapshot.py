"""The GroupSnapshot `podgroup.decide` reads for one PodGroup, built one way for both readers:
the provisioner (from its caches, reconcile/podgroup.py) and the diagnosis (from one live
read, logic/podgroups/group_diagnosis.py), so a diagnosis replays the decision the
provisioner makes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from gangcheck.logic.attempt.fulfillment import ClusterView
from gangcheck.logic.placement.fit import Requirement
from gangcheck.logic.podgroups.podgroup import GroupSnapshot
from gangcheck.model.names import GROUP_UID_ANNOTATION
from gangcheck.model.objects import Obj, Pod, request_of
from gangcheck.model.podgroups import PodGroup
from gangcheck.model.provisioning_config import AtomicProvisioningSpec, LabelSelector, parse_spec

CONFIG_KIND = "AtomicProvisioningConfig"


def config_named(
    name: str, get: Callable[[str], Obj | None]
) -> tuple[AtomicProvisioningSpec | None, str]:
    """The config of that name (the defaults for ""), or why there is none."""
    if not name:
        return AtomicProvisioningSpec(), ""
    obj = get(name)
    if obj is None:
        return None, f"{CONFIG_KIND} {name!r} not found"
    try:
        return parse_spec(obj.get("spec")), ""
    except ValueError as e:
        return None, f"{CONFIG_KIND} {name!r}: {e}"


def config_serving(
    name: str,
    get: Callable[[str], Obj | None],
    *,
    namespace: str,
    labels: Mapping[str, str] | None,
) -> tuple[AtomicProvisioningSpec | None, str]:
    """The config of that name for a group of `namespace` (`config_named`), or why there is
    none: also when its `spec.podGroups.namespaceSelector` does not select the namespace's
    `labels` (None: not known, the selector not read)."""
    spec, problem = config_named(name, get)
    if spec is None or labels is None:
        return spec, problem
    if not selects(spec.pod_groups.namespace_selector, labels):
        return None, (
            f"{CONFIG_KIND} {name!r} does not serve namespace {namespace!r} "
            "(spec.podGroups.namespaceSelector)"
        )
    return spec, ""


def selects(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """Whether a label selector selects an object with these labels: every matchLabels pair
    and every requirement holds (Kubernetes' rules: NotIn and DoesNotExist hold for a label
    absent). None, no selector, selects everything: a config's namespaceSelector unset serves
    every namespace, as configs did before the field."""
    if selector is None:
        return True
    wanted = [Requirement(key, "In", (value,)) for key, value in selector.match_labels.items()]
    wanted += [Requirement(r.key, r.operator.value, r.values) for r in selector.match_expressions]
    return all(r.matches(labels) for r in wanted)


def group_snapshot_of(
    group: PodGroup,
    members: Sequence[Pod],
    *,
    config: tuple[AtomicProvisioningSpec | None, str],
    requests: Iterable[Obj],
    capacity: ClusterView | None,
    max_members: int,
    opted_in: bool,
    templates: frozenset[str] = frozenset(),
) -> GroupSnapshot:
    """What `decide` reads for the group: `config` as (spec, why none), the requests made for
    this group (by uid: not an earlier group of the same name). `requests` may hold others:
    they are left out."""
    spec, problem = config
    mine = tuple(
        request_of(r)
        for r in requests
        if ((r.get("metadata") or {}).get("annotations") or {}).get(GROUP_UID_ANNOTATION)
        == group.ref.uid
    )
    return GroupSnapshot(
        group=group,
        members=tuple(members),
        config=spec,
        config_problem=problem,
        requests=mine,
        templates=templates,
        capacity=capacity,
        max_members=max_members,
        opted_in=opted_in,
    )
