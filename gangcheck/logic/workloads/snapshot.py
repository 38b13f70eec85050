"""The Snapshot `admission.decide` reads for one Workload and one check, built one way for
both readers: the controller (from its caches, reconcile/workload.py) and the diagnosis (from
one live read, logic/workloads/diagnosis.py), so a diagnosis replays the decision the
controller makes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from gangcheck.logic.attempt.fulfillment import ClusterView
from gangcheck.logic.workloads import checkconfig
from gangcheck.logic.workloads.admission import Snapshot
from gangcheck.model.names import CHECK_ANNOTATION
from gangcheck.model.objects import Flavor, Obj, Workload, request_of


def snapshot_of(
    wl: Workload,
    check: str,
    *,
    admission_check: Callable[[str], Obj | None],
    config: Callable[[str], Obj | None],
    requests: Iterable[Obj],
    flavors: Mapping[str, Flavor],
    capacity: ClusterView | None,
    templates: frozenset[str] = frozenset(),
) -> Snapshot:
    """What `decide` reads for the Workload's `check`: its config as resolved now, the
    requests made for this Workload (by uid) and this check, and the other checks of the
    Workload that provision capacity too. `requests` may hold any others: they are left out."""
    ac = admission_check(check)
    resolution = checkconfig.resolve(ac, config)
    mine = tuple(
        request_of(r)
        for r in requests
        if _check_of(r) == check and request_of(r).workload_uid == wl.ref.uid
    )
    return Snapshot(
        workload=wl,
        check=check,
        config=resolution.spec,
        config_problem=resolution.message,
        flavors=flavors,
        requests=mine,
        templates=templates,
        capacity=capacity,
        competing=competing(wl, check, admission_check),
        inactive=_inactive(ac) if resolution.active else "",
    )


def _inactive(ac: Obj | None) -> str:
    """Why the check is Active=False though its config resolves (a NodePool a Karpenter
    source names is missing): its Active condition's message; '' when it is not False."""
    for cond in ((ac or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Active" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "Active is False")
    return ""


def competing(
    wl: Workload, check: str, admission_check: Callable[[str], Obj | None]
) -> tuple[str, ...]:
    """The Workload's other checks that provision capacity (gangcheck's or Kueue's)."""
    return tuple(
        sorted(
            name
            for name in wl.checks
            if name != check and (ac := admission_check(name)) and checkconfig.provisions(ac)
        )
    )


def _check_of(obj: Obj) -> str:
    return str(((obj.get("metadata") or {}).get("annotations") or {}).get(CHECK_ANNOTATION, ""))
