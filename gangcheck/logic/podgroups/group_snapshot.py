"""The GroupSnapshot `podgroup.decide` reads for one PodGroup, built one way for both readers:
the provisioner (from its caches, reconcile/podgroup.py) and the diagnosis (from one live
read, logic/podgroups/group_diagnosis.py), so a diagnosis replays the decision the
provisioner makes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from gangcheck.logic.attempt.fulfillment import ClusterView
from gangcheck.logic.podgroups.podgroup import GroupSnapshot
from gangcheck.model.names import GROUP_UID_ANNOTATION
from gangcheck.model.objects import Obj, Pod, request_of
from gangcheck.model.podgroups import PodGroup
from gangcheck.model.provisioning_config import AtomicProvisioningSpec, parse_spec

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
