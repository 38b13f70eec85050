"""`gangcheck diagnose TARGET` and `gangcheck status`: read the cluster, say what blocks a gang.

A gang is a Kueue Workload or a PodGroup (either API). This module fetches (with ``Kube``) and
renders; ``gangcheck.logic.workloads.diagnosis`` and
``gangcheck.logic.podgroups.group_diagnosis`` judge (an attempt served with NodeClaims:
``gangcheck.logic.capacity.karpenter.explain`` says what its claims say). The
entry points ``main_diagnose`` and ``main_status`` take their own arguments (``TARGET``,
``-n``, ``--kubeconfig``, ``-o text|json``) and return the exit code: 0 when diagnosed, 1
with a one-line error on stderr when the target does not exist or is not a gang.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import textwrap
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from gangcheck.kube.client import Kube
from gangcheck.kube.discovery import ServedPodGroups, served_pod_group_apis
from gangcheck.kube.errors import ApiError, ForbiddenError, NotFoundError
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    ATOMIC_CONFIG,
    CLUSTER_QUEUE,
    DEVICE_CLASS,
    JOB,
    LOCAL_QUEUE,
    NAMESPACE,
    NODE,
    NODE_CLAIM,
    POD,
    PROVISIONING_REQUEST,
    RESOURCE_CLAIM,
    RESOURCE_CLAIM_TEMPLATE,
    RESOURCE_FLAVOR,
    RESOURCE_SLICE,
    WORKLOAD,
    Resource,
)
from gangcheck.logic.attempt.explain import (
    GangRow,
    NodeFit,
    Placement,
    RequestFacts,
    Verdict,
    World,
    human_duration,
)
from gangcheck.logic.capacity.karpenter.explain import (
    ANY_ATTEMPT,
    NodeClaimFacts,
    attempt_key,
    attempt_selector,
    claim_rows,
    is_karpenter,
    request_claims,
    unreadable,
)
from gangcheck.logic.capacity.provreq import CONDITION_TYPES
from gangcheck.logic.podgroups.gating import OPT_IN_VALUE, PodGroupRef, group_of
from gangcheck.logic.podgroups.group_diagnosis import (
    GroupFacts,
    gather_group,
    group_row,
    group_verdict,
    in_flight,
    members_by_group,
)
from gangcheck.logic.podgroups.podgroup import RELEASED
from gangcheck.logic.timefmt import format_time
from gangcheck.logic.workloads.diagnosis import (
    Facts,
    Target,
    TargetError,
    gang_row,
    gather,
    is_gang,
    parse_target,
    verdict,
)
from gangcheck.model.names import (
    GATE,
    JOB_UID_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    OPT_IN_LABEL,
    POD_GROUP_LABEL,
    PREBUILT_WORKLOAD_LABEL,
    QUEUE_LABEL,
    UNGATED_ANNOTATION,
    WORKLOAD_NAME_ANNOTATION,
)
from gangcheck.model.objects import Obj, flavor_of
from gangcheck.model.podgroups import PLUGINS, UPSTREAM

R = TypeVar("R")


# Where Kueue v0.17 records a pod's Workload (sigs.k8s.io/kueue apis/kueue/v1beta2,
# pkg/controller/constants, pkg/controller/jobs/pod/constants).
NOT_FINISHED = "status.phase!=Succeeded,status.phase!=Failed"
NODES_SHOWN = 24
WIDTH = 100


class DiagnoseError(Exception):
    """The target cannot be diagnosed: missing, not a gang, or a kind not served."""


class PodGroupMember(DiagnoseError):
    """The pod belongs to no Kueue Workload, but names a PodGroup: that is its gang."""

    def __init__(self, message: str, group: PodGroupRef) -> None:
        super().__init__(message)
        self.group = group


@dataclass(frozen=True)
class DiagnoseReport:
    target: Target
    facts: Facts
    verdict: Verdict
    now: datetime
    claims: NodeClaimFacts | None = None
    """The attempt's NodeClaims, when Karpenter serves its request."""

    @property
    def workload(self) -> str:
        return f"{self.facts.namespace}/{self.facts.name}"


@dataclass(frozen=True)
class GroupReport:
    """The diagnosis of a PodGroup's gang (`via`: the pod the user named, if any)."""

    target: Target
    facts: GroupFacts
    verdict: Verdict
    now: datetime
    via: Target | None = None
    claims: NodeClaimFacts | None = None
    """The attempt's NodeClaims, when Karpenter serves its request."""

    @property
    def group(self) -> str:
        return f"{self.facts.namespace}/{self.facts.name}"


Report = DiagnoseReport | GroupReport
PodGroups = tuple[ServedPodGroups, list[tuple[str, Obj]]]


@dataclass(frozen=True)
class StatusReport:
    namespace: str | None
    gangs: tuple[GangRow, ...]
    now: datetime


# ---- the API -----------------------------------------------------------------------------


async def diagnose(kube: Kube, target: str, *, now: datetime | None = None) -> Report:
    """Find the target's gang (a Workload, or a PodGroup) and walk its chain; DiagnoseError
    when there is none."""
    parsed = _parse(target)
    if parsed.kind == "podgroup":
        return await diagnose_group(kube, parsed, now=now)
    try:
        workload = await find_workload(kube, parsed)
    except PodGroupMember as e:
        group = Target("podgroup", parsed.namespace, e.group.name, e.group.api_group)
        return await diagnose_group(kube, group, now=now, via=parsed)
    world = await fetch_world(kube, parsed.namespace)
    when = now or datetime.now(UTC)
    facts = gather(workload, world)
    claims = await attempt_node_claims(kube, facts.namespace, facts.request)
    return DiagnoseReport(parsed, facts, verdict(facts, when), when, claims)


async def diagnose_group(
    kube: Kube, target: Target, *, now: datetime | None = None, via: Target | None = None
) -> GroupReport:
    """The PodGroup named, in the API the target names, else the upstream one, else the
    scheduler-plugins one (whichever the server serves and holds it); DiagnoseError when
    neither holds it and no pod names it."""
    served = await served_pod_group_apis(kube)
    resources = {UPSTREAM: served.upstream, PLUGINS: served.plugins}
    apis = [target.api_group] if target.api_group else [UPSTREAM, PLUGINS]
    ns, name = target.namespace, target.name
    obj, api_group = None, ""
    for api in apis:
        res = resources.get(api)
        if res is not None and (obj := await _get(kube, res, name, ns)) is not None:
            api_group = api
            break
    world, opted_in = await asyncio.gather(fetch_group_world(kube, ns), _opted_in(kube, ns))
    by_group = members_by_group(world.pods)
    if not api_group:
        # Not found: whichever API its members name, else the first one served.
        named = [a for a in apis if by_group.get((ns, a, name))]
        first = [a for a in apis if resources.get(a) is not None]
        api_group = (named or first or apis)[0]
    members = by_group.get((ns, api_group, name), [])
    if obj is None and not members:
        raise DiagnoseError(_missing_group(served, target, api_group))
    when = now or datetime.now(UTC)
    facts = gather_group(
        obj,
        members,
        world,
        namespace=ns,
        name=name,
        api_group=api_group,
        served=resources.get(api_group) is not None,
        opted_in=opted_in,
    )
    claims = await attempt_node_claims(kube, ns, facts.request)
    return GroupReport(target, facts, group_verdict(facts, when), when, via, claims)


def _missing_group(served: ServedPodGroups, target: Target, api_group: str) -> str:
    where = f"{target.namespace}/{target.name}"
    if not served.resources:
        return (
            f"PodGroup {where}: this cluster serves no PodGroup API "
            f"({UPSTREAM} v1beta1 or v1alpha2, {PLUGINS} v1alpha1)"
        )
    if target.api_group:
        res = served.upstream if api_group == UPSTREAM else served.plugins
        if res is None:
            return f"PodGroup {where}: this cluster does not serve {api_group} PodGroups"
    return f"PodGroup {where} not found"


async def status(
    kube: Kube, namespace: str | None = None, *, now: datetime | None = None
) -> StatusReport:
    """Every gang in flight: a Workload one of our checks cares about, not finished; a
    PodGroup gangcheck keeps a state on or holds members of."""
    workloads, world, groups, namespaces = await asyncio.gather(
        _items(kube, WORKLOAD, namespace, optional=True),
        fetch_world(kube, namespace),
        _pod_groups(kube, namespace),
        _maybe(kube, NAMESPACE, None),
    )
    when = now or datetime.now(UTC)
    gangs = [gather(wl, world) for wl in workloads if is_gang(wl, world) and not _is_finished(wl)]
    rows = [(gang_row(facts, when), facts.request) for facts in gangs]
    opted_in = None if namespaces is None else {_name(n): _is_opted_in(n) for n in namespaces}
    rows += [
        (group_row(facts, when), facts.request)
        for facts in _group_facts(groups, world, namespace, opted_in)
        if in_flight(facts)
    ]
    with_claims = await _with_claims(kube, rows)
    with_claims.sort(key=lambda r: (r.namespace, r.name, r.kind))
    return StatusReport(namespace, tuple(with_claims), when)


async def _with_claims(
    kube: Kube, rows: Sequence[tuple[GangRow, RequestFacts | None]]
) -> list[GangRow]:
    """The rows, those of Karpenter attempts with their arrived/asked NodeClaims (one list of
    every gang's claims; none when they cannot be read)."""
    if not any(is_karpenter(req) for _, req in rows):
        return [row for row, _ in rows]
    listed = await _node_claims(kube, ANY_ATTEMPT)
    if isinstance(listed, str):
        return [row for row, _ in rows]
    out = []
    for row, req in rows:
        if req is not None and is_karpenter(req):
            claims = request_claims(listed, row.namespace, req)
            out.append(replace(row, claims_arrived=claims.arrived, claims_asked=claims.asked))
        else:
            out.append(row)
    return out


async def attempt_node_claims(
    kube: Kube, namespace: str, request: RequestFacts | None
) -> NodeClaimFacts | None:
    """The NodeClaims of the attempt whose request is ``request``, when Karpenter serves it:
    one list, optional (``not readable`` without Karpenter's CRDs or the right to list)."""
    if request is None or not is_karpenter(request):
        return None
    listed = await _node_claims(kube, attempt_selector(attempt_key(namespace, request)))
    if isinstance(listed, str):
        return unreadable(request.members, listed)
    return request_claims(listed, namespace, request)


async def _node_claims(kube: Kube, selector: str) -> list[Obj] | str:
    """The NodeClaims the selector matches, or why they cannot be listed."""
    try:
        return await _items(kube, NODE_CLAIM, label_selector=selector)
    except NotFoundError:
        return "NodeClaims are not served here: Karpenter's CRDs are not installed"
    except ForbiddenError as e:
        return f"forbidden: {e.message}"
    except ApiError as e:
        return f"{e.status} {e.reason}: {e.message}"


def _group_facts(
    pod_groups: PodGroups,
    world: World,
    namespace: str | None,
    opted_in: dict[str, bool] | None,
) -> list[GroupFacts]:
    """Every PodGroup listed, and every PodGroup gated members name that does not exist."""
    served, groups = pod_groups
    by_group = members_by_group(world.pods)
    out, seen = [], set()
    for api_group, obj in groups:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), api_group, str(meta.get("name") or ""))
        seen.add(key)
        out.append(
            gather_group(
                obj,
                by_group.get(key, []),
                world,
                namespace=key[0],
                name=key[2],
                api_group=api_group,
                opted_in=opted_in.get(key[0]) if opted_in is not None else None,
            )
        )
    for key, members in by_group.items():
        if key in seen or (namespace is not None and key[0] != namespace):
            continue
        ns, api_group, name = key
        out.append(
            gather_group(
                None,
                members,
                world,
                namespace=ns,
                name=name,
                api_group=api_group,
                served=any(res.group == api_group for res in served.resources),
                opted_in=opted_in.get(ns) if opted_in is not None else None,
            )
        )
    return out


def _parse(target: str) -> Target:
    try:
        return parse_target(target)
    except TargetError as e:
        raise DiagnoseError(str(e)) from e


def _is_finished(workload: Obj) -> bool:
    conditions = (workload.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Finished" and c.get("status") == "True" for c in conditions)


# ---- finding the Workload ----------------------------------------------------------------


async def find_workload(kube: Kube, target: Target) -> Obj:
    if target.kind == "workload":
        found = await _get(kube, WORKLOAD, target.name, target.namespace)
        if found is None:
            raise DiagnoseError(f"Workload {target.namespace}/{target.name} not found")
        return found
    if target.kind == "job":
        return await _workload_of_job(kube, target)
    return await _workload_of_pod(kube, target)


async def _workload_of_job(kube: Kube, target: Target) -> Obj:
    job = await _get(kube, JOB, target.name, target.namespace)
    if job is None:
        raise DiagnoseError(f"Job {target.namespace}/{target.name} not found")
    meta = job["metadata"]
    labels = meta.get("labels") or {}
    named = labels.get(PREBUILT_WORKLOAD_LABEL)
    found = await _named_or_owned(kube, target.namespace, named, {meta.get("uid", "")})
    if found is not None:
        return found
    hint = (
        f"it has no {QUEUE_LABEL} label, so Kueue does not manage it"
        if QUEUE_LABEL not in labels
        else "Kueue has not made one for it (is Kueue running?)"
    )
    raise DiagnoseError(
        f"Job {target.namespace}/{target.name} is not a gang: no Kueue Workload belongs to it; "
        + hint
    )


async def _workload_of_pod(kube: Kube, target: Target) -> Obj:
    """The pod's Workload: by the name Kueue put on it, else through its owners."""
    pod = await _get(kube, POD, target.name, target.namespace)
    if pod is None:
        raise DiagnoseError(f"Pod {target.namespace}/{target.name} not found")
    meta = pod["metadata"]
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    named = (
        annotations.get(WORKLOAD_NAME_ANNOTATION)
        or labels.get(PREBUILT_WORKLOAD_LABEL)
        or labels.get(POD_GROUP_LABEL)
    )
    uids = {meta.get("uid", "")} | await _owner_uids(kube, target.namespace, meta)
    found = await _named_or_owned(kube, target.namespace, named, uids)
    if found is None:
        message = (
            f"Pod {target.namespace}/{target.name} is not a gang: no Kueue Workload belongs to "
            "it or to its owners"
        )
        group = group_of(pod)
        if group is not None:
            raise PodGroupMember(message, group)
        raise DiagnoseError(message + ", and it names no PodGroup")
    return found


async def _owner_uids(kube: Kube, namespace: str, meta: Obj) -> set[str]:
    """Owners of a pod, and the owners of an owning Job (a JobSet's, say)."""
    uids = set()
    for ref in meta.get("ownerReferences") or []:
        uids.add(str(ref.get("uid", "")))
        if ref.get("kind") == "Job" and str(ref.get("apiVersion", "")).startswith("batch/"):
            job = await _get(kube, JOB, str(ref.get("name", "")), namespace)
            owners = ((job or {}).get("metadata") or {}).get("ownerReferences") or []
            uids.update(str(o.get("uid", "")) for o in owners)
    return uids - {""}


async def _named_or_owned(
    kube: Kube, namespace: str, name: str | None, owner_uids: set[str]
) -> Obj | None:
    if name:
        found = await _get(kube, WORKLOAD, name, namespace)
        if found is not None:
            return found
    owned = [wl for wl in await _items(kube, WORKLOAD, namespace) if _owned_by(wl, owner_uids)]
    # Several (an old one being replaced): the unfinished one, newest first.
    owned.sort(
        key=lambda wl: (not _is_finished(wl), wl["metadata"].get("creationTimestamp", "")),
        reverse=True,
    )
    return owned[0] if owned else None


def _owned_by(workload: Obj, uids: set[str]) -> bool:
    meta = workload.get("metadata") or {}
    if (meta.get("labels") or {}).get(JOB_UID_LABEL) in uids:
        return True
    return any(ref.get("uid") in uids for ref in meta.get("ownerReferences") or [])


# ---- fetching ----------------------------------------------------------------------------


async def fetch_world(kube: Kube, namespace: str | None) -> World:
    """The cluster objects a diagnosis reads, fetched at once."""
    managed = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
    checks, configs, flavors, requests, nodes, pods = await asyncio.gather(
        _items(kube, ADMISSION_CHECK, optional=True),
        _items(kube, ATOMIC_CONFIG, optional=True),
        _items(kube, RESOURCE_FLAVOR, optional=True),
        _everywhere(kube, PROVISIONING_REQUEST, namespace, label_selector=managed),
        _items(kube, NODE),
        _everywhere(kube, POD, namespace, field_selector=NOT_FINISHED),
    )
    cqs, lqs = await asyncio.gather(
        _maybe(kube, CLUSTER_QUEUE, None), _maybe(kube, LOCAL_QUEUE, namespace)
    )
    return World(
        admission_checks=_by_key(checks),
        configs=_by_key(configs),
        flavors={f["metadata"]["name"]: flavor_of(f) for f in flavors},
        requests=tuple(requests),
        nodes=tuple(nodes),
        pods=tuple(pods),
        cluster_queues=_by_key(cqs) if cqs is not None else None,
        local_queues=_by_key(lqs) if lqs is not None else None,
        **_device_fields(await _devices(kube)),
    )


async def fetch_group_world(kube: Kube, namespace: str) -> World:
    """What a PodGroup's diagnosis reads: the requests in flight, the nodes, the pods."""
    managed = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
    requests, nodes, pods = await asyncio.gather(
        _everywhere(kube, PROVISIONING_REQUEST, namespace, label_selector=managed),
        _items(kube, NODE),
        _everywhere(kube, POD, namespace, field_selector=NOT_FINISHED),
    )
    return World(
        requests=tuple(requests),
        nodes=tuple(nodes),
        pods=tuple(pods),
        **_device_fields(await _devices(kube)),
    )


Devices = tuple[tuple[Obj, ...], tuple[Obj, ...], tuple[Obj, ...], tuple[Obj, ...]]


def _device_fields(devices: Devices) -> dict[str, Any]:
    names = ("device_classes", "resource_slices", "resource_claims", "claim_templates")
    return dict(zip(names, devices, strict=True))


async def _devices(kube: Kube) -> Devices:
    """The DRA objects the fit counts devices from (none where DRA is not served)."""

    async def readable(res: Resource) -> list[Obj]:
        try:
            return await _items(kube, res, optional=True)
        except ForbiddenError:
            return []  # the fit then counts no devices, as a gang with claims fits nowhere

    classes, slices, claims, templates = await asyncio.gather(
        readable(DEVICE_CLASS),
        readable(RESOURCE_SLICE),
        readable(RESOURCE_CLAIM),
        readable(RESOURCE_CLAIM_TEMPLATE),
    )
    return tuple(classes), tuple(slices), tuple(claims), tuple(templates)


async def _pod_groups(kube: Kube, namespace: str | None) -> PodGroups:
    """The PodGroup APIs served, and (API group, PodGroup) of every PodGroup they hold."""
    served = await served_pod_group_apis(kube)
    listings = await asyncio.gather(
        *(_items(kube, res, namespace, optional=True) for res in served.resources)
    )
    return served, [
        (res.group, obj)
        for res, items in zip(served.resources, listings, strict=True)
        for obj in items
    ]


async def _opted_in(kube: Kube, namespace: str) -> bool | None:
    """Whether the namespace opted in to gating (None: it cannot be read)."""
    try:
        found = await _get(kube, NAMESPACE, namespace, None)
    except ApiError:
        return None
    return _is_opted_in(found) if found is not None else None


def _is_opted_in(namespace: Obj) -> bool:
    labels = (namespace.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(OPT_IN_LABEL) == OPT_IN_VALUE)


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _by_key(items: list[Obj]) -> dict[str, Obj]:
    out = {}
    for item in items:
        meta = item.get("metadata") or {}
        ns = meta.get("namespace")
        out[f"{ns}/{meta['name']}" if ns else str(meta["name"])] = item
    return out


async def _get(kube: Kube, res: Resource, name: str, namespace: str | None) -> Obj | None:
    try:
        return await kube.get(res, name, namespace)
    except NotFoundError:
        return None


async def _items(
    kube: Kube,
    res: Resource,
    namespace: str | None = None,
    *,
    optional: bool = False,
    label_selector: str | None = None,
    field_selector: str | None = None,
) -> list[Obj]:
    try:
        listing = await kube.list_objects(
            res, namespace, label_selector=label_selector, field_selector=field_selector
        )
    except NotFoundError:
        if optional:
            return []  # the resource is not served here (its CRD is not installed)
        raise
    return list(listing.get("items") or [])


async def _everywhere(
    kube: Kube, res: Resource, namespace: str | None, **selectors: str
) -> list[Obj]:
    """Every namespace if allowed (claims and bound pods cross namespaces), else one."""
    try:
        return await _items(kube, res, None, optional=True, **selectors)
    except ForbiddenError:
        if namespace is None:
            raise
        return await _items(kube, res, namespace, optional=True, **selectors)


async def _maybe(kube: Kube, res: Resource, namespace: str | None) -> list[Obj] | None:
    """Context that makes a verdict better but is not required: None when unreadable."""
    try:
        return await _items(kube, res, namespace)
    except ApiError:
        return None


# ---- text --------------------------------------------------------------------------------


def render_text(report: Report | StatusReport) -> str:
    if isinstance(report, StatusReport):
        return _status_text(report)
    if isinstance(report, GroupReport):
        return "\n".join(_group_lines(report)) + "\n"
    return "\n".join(_diagnosis_lines(report)) + "\n"


def _diagnosis_lines(report: DiagnoseReport) -> list[str]:
    facts, now = report.facts, report.now
    head = f"Workload {report.workload}"
    if report.target.kind != "workload":
        head = f"{report.target.kind.capitalize()} {report.target.namespace}/"
        head += f"{report.target.name} -> Workload {report.workload}"
    lines = [head, ""]
    lines += _section("quota", _quota_lines(facts, now))
    lines += _section("checks", _check_lines(facts))
    if facts.request is not None:
        lines += _section("request", _request_lines(facts, now))
    if facts.placement is not None:
        lines += _section("nodes", _node_lines(facts))
    if report.claims is not None:
        lines += _section("claims", _claim_lines(report.claims))
    if facts.start is not None:
        start = facts.start
        lines += _section("start", [f"{start.scheduled} of {start.total} members scheduled"])
    return [*lines, "", report.verdict.line]


def _section(label: str, body: list[str]) -> list[str]:
    if not body:
        return []
    return [f"{label:<9} {body[0]}", *(f"{'':<9} {line}" for line in body[1:])]


def _quota_lines(facts: Facts, now: datetime) -> list[str]:
    st = facts.state
    queue = f"LocalQueue {st.local_queue}" if st.local_queue else "no LocalQueue"
    if st.reserved:
        where = f"ClusterQueue {st.cluster_queue}" if st.cluster_queue else "a ClusterQueue"
        lines = [f"reserved in {where} ({queue})"]
        if st.admitted:
            lines.append("admitted")
        return lines
    cq = f", ClusterQueue {st.cluster_queue}" if st.cluster_queue else ""
    lines = [f"not reserved ({queue}{cq})"]
    cond = st.quota_condition
    if cond is not None and (cond.reason or cond.message):
        lines += _wrapped(f"QuotaReserved=False {cond.reason}: {cond.message}".rstrip(": "))
    if st.requeue_at is not None:
        lines.append(f"requeue at {format_time(st.requeue_at)} ({_relative(st.requeue_at, now)})")
    if st.evicted is not None:
        lines += _wrapped(f"evicted ({st.evicted.reason}): {st.evicted.message}".rstrip(": "))
    return lines


def _check_lines(facts: Facts) -> list[str]:
    if not facts.checks:
        return ["none listed on the Workload"]
    rows = []
    for c in facts.checks:
        whose = "gangcheck" if c.ours else (c.controller or "unknown")
        active = "active" if c.active else "INACTIVE"
        rows.append([c.name, whose, c.state or "(not listed)", f"attempt {c.attempt}", active])
    lines = _table(rows)
    out: list[str] = []
    for line, c in zip(lines, facts.checks, strict=True):
        out.append(line)
        if not c.active:
            out += _wrapped(f"inactive: {c.problem}", indent=2)
        if c.message:
            out += _wrapped(c.message, indent=2)
        if c.requeue_after_seconds:
            out.append(f"  requeue after {human_duration(c.requeue_after_seconds)}")
    return out


def _request_lines(facts: Facts, now: datetime) -> list[str]:
    assert facts.request is not None
    return _lines_of_request(facts.namespace, facts.request, now)


def _lines_of_request(namespace: str, req: RequestFacts, now: datetime) -> list[str]:
    where = f"{namespace}/{req.name} (attempt {req.attempt})"
    if not req.found:
        return [f"{where}: not found"]
    lines = [where]
    rows = [
        [kind, c.status, c.reason, _cut(c.message, 60)]
        for kind in CONDITION_TYPES
        if (c := req.conditions.get(kind)) is not None
    ]
    lines += [f"  {line}" for line in _table(rows)] or ["  no conditions yet"]
    when = ""
    if req.deadline is not None:
        when = f"; deadline {format_time(req.deadline)} ({_relative(req.deadline, now)})"
    lines.append(f"  phase {req.phase or '-'}{when}")
    if req.rollback_reason:
        lines += _wrapped(f"rollback: {req.rollback_reason}", indent=2)
    if req.outcome is not None:
        lines += _wrapped(f"outcome: {req.outcome.summary()}", indent=2)
    return lines


def _node_lines(facts: Facts) -> list[str]:
    assert facts.placement is not None
    return _lines_of_placement(facts.placement)


def _lines_of_placement(placement: Placement) -> list[str]:
    arrived = placement.arrived
    unrecorded = sum(1 for n in arrived if not n.recorded)
    head = f"{len(arrived)} arrived" + (f" ({unrecorded} not recorded yet)" if unrecorded else "")
    lines = [head + f"; {placement.placeable} of {placement.total} members placeable"]
    shown: list[NodeFit] = list(arrived) if arrived else list(placement.nodes)
    others = [n for n in placement.nodes if not n.arrived] if arrived else []
    if not shown:
        return [*lines, "no node matches the gang's node selectors"]
    rows = [["NODE", "ARRIVED", "TAKES", "WHY NOT"]]
    rows += [[n.name, _arrived(n), str(n.members), n.reason or "-"] for n in shown[:NODES_SHOWN]]
    lines += [f"  {_cut(line, WIDTH - 12)}" for line in _table(rows)]
    if len(shown) > NODES_SHOWN:
        lines.append(f"  ... and {len(shown) - NODES_SHOWN} more nodes")
    if others:
        taking = sum(1 for n in others if n.members)
        lines.append(
            f"also counted: {len(others)} other nodes its selectors match ({taking} take members)"
        )
    return lines


def _arrived(node: NodeFit) -> str:
    if not node.arrived:
        return "no"
    return "yes" if node.recorded else "new"


def _group_lines(report: GroupReport) -> list[str]:
    f, now = report.facts, report.now
    head = f"PodGroup {report.group} ({f.api_version or f.api_group})"
    if report.via is not None:
        head = f"{report.via.kind.capitalize()} {report.via.namespace}/{report.via.name} -> {head}"
    lines = [head, ""]
    if not f.found:
        lines += _section("group", [f"not found ({f.api_group})" if f.served else "not served"])
    else:
        lines += _section("gang", [_gang_line(f)])
        lines += _section("state", _state_lines(f, now))
    lines += _section("members", _member_lines(f))
    if f.request is not None:
        lines += _section("request", _lines_of_request(f.namespace, f.request, now))
    if f.placement is not None:
        lines += _section("nodes", _lines_of_placement(f.placement))
    if report.claims is not None:
        lines += _section("claims", _claim_lines(report.claims))
    return [*lines, "", report.verdict.line]


def _claim_lines(claims: NodeClaimFacts) -> list[str]:
    """The summary of the attempt's NodeClaims, then one row per claim (and its message)."""
    lines = _wrapped(claims.line)
    table = _table(claim_rows(claims))
    lines += [f"  {_cut(line, WIDTH - 12)}" for line in table[:1]]
    for line, claim in zip(table[1:], claims.claims, strict=True):
        lines.append(f"  {_cut(line, WIDTH - 12)}")
        if claim.message:
            lines += _wrapped(claim.message, indent=4)
    return lines


def _gang_line(f: GroupFacts) -> str:
    if not f.is_gang:
        return "no gang policy (basic)"
    parts = [f"minCount {f.min_count}"]
    if f.topology_key:
        parts.append(f"all members in one {f.topology_key} domain")
    parts.append(f"config {f.config}" if f.config else "the controller's default config")
    return "; ".join(parts)


def _state_lines(f: GroupFacts, now: datetime) -> list[str]:
    if not f.state and f.reported_ungated:
        count = len(f.reported_ungated)
        return [
            f"none: gangcheck reported {count} member(s) created without the {GATE} gate "
            f"({UNGATED_ANNOTATION}, Events MemberNotGated) and holds no member"
        ]
    if not f.state:
        return ["none yet (gangcheck has not acted on the group)"]
    lines = [f"{f.state}, attempt {f.attempt}"]
    if f.message:
        lines += _wrapped(f.message, indent=2)
    if f.next_attempt_at is not None:
        when = f"next attempt at {format_time(f.next_attempt_at)}"
        lines.append(f"  {when} ({_relative(f.next_attempt_at, now)})")
    return lines


def _member_lines(f: GroupFacts) -> list[str]:
    m = f.members
    of = f" of {f.min_count}" if f.found and f.is_gang else ""
    verb = "exist" if f.found else "name it"
    lines = [f"{m.exist}{of} {verb}: {len(m.gated)} gated, {len(m.bound)} bound"]
    if m.ungated and f.state != RELEASED:
        lines += _wrapped(f"without the {GATE} gate: {', '.join(m.ungated)}", indent=2)
    if f.late:
        text = f"created after the gang was read, no part of its request: {', '.join(f.late)}"
        lines += _wrapped(text, indent=2)
    reported = [n for n in f.reported_ungated if n not in m.ungated]
    if reported:
        lines += _wrapped(f"reported created without the gate: {', '.join(reported)}", indent=2)
    if f.opted_in is False and f.found:
        lines.append(f"  namespace {f.namespace} is not opted in ({OPT_IN_LABEL}={OPT_IN_VALUE})")
    return lines


def _status_text(report: StatusReport) -> str:
    if not report.gangs:
        where = f" in namespace {report.namespace}" if report.namespace else ""
        return f"No gangs in flight{where}.\n"
    head = ["KIND", "NAMESPACE/NAME", "CHECK", "STATE", "PHASE", "ATTEMPT", "AGE", "NODES"]
    rows = [[*head, "MEMBERS", "VERDICT"]]
    for g in report.gangs:
        rows.append(
            [
                g.kind,
                f"{g.namespace}/{g.name}",
                g.check or "-",
                g.state or "-",
                g.phase,
                str(g.attempt) if g.attempt else "-",
                human_duration(g.age_seconds) if g.age_seconds is not None else "-",
                g.nodes_cell,
                g.members_cell,
                g.verdict,
            ]
        )
    return "\n".join(_table(rows)) + "\n"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _wrapped(text: str, *, indent: int = 0) -> list[str]:
    pad = " " * indent
    return textwrap.wrap(text, WIDTH - 10, initial_indent=pad, subsequent_indent=pad + "  ") or []


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _relative(when: datetime, now: datetime) -> str:
    left = (when - now).total_seconds()
    return f"in {human_duration(left)}" if left >= 0 else f"{human_duration(-left)} ago"


# ---- JSON --------------------------------------------------------------------------------


def to_json(report: Report | StatusReport) -> dict[str, Any]:
    if isinstance(report, StatusReport):
        return {
            "kind": "GangStatusList",
            "namespace": report.namespace,
            "time": format_time(report.now),
            "items": [_row_json(g) for g in report.gangs],
        }
    if isinstance(report, GroupReport):
        return _group_json(report)
    return _diagnosis_json(report)


def _row_json(g: GangRow) -> dict[str, Any]:
    return {
        "kind": g.kind,
        "namespace": g.namespace,
        "name": g.name,
        "check": g.check,
        "state": g.state,
        "phase": g.phase,
        "attempt": g.attempt,
        "request": g.request,
        "ageSeconds": g.age_seconds,
        "nodesArrived": g.arrived,
        "nodesNeeded": g.needed,
        "nodeClaimsArrived": g.claims_arrived,
        "nodeClaimsAsked": g.claims_asked,
        "membersPlaceable": g.placeable,
        "members": g.total,
        "verdict": g.verdict,
    }


def _diagnosis_json(report: DiagnoseReport) -> dict[str, Any]:
    facts, now = report.facts, report.now
    return {
        "kind": "GangDiagnosis",
        "target": str(report.target),
        "time": format_time(now),
        "workload": {"namespace": facts.namespace, "name": facts.name},
        "quota": _quota_json(facts),
        "checks": [
            {
                "name": c.name,
                "ours": c.ours,
                "exists": c.exists,
                "controller": c.controller,
                "state": c.state,
                "message": c.message,
                "retryCount": c.retry_count,
                "requeueAfterSeconds": c.requeue_after_seconds,
                "active": c.active,
                "inactiveReason": c.problem,
            }
            for c in facts.checks
        ],
        "focus": facts.focus,
        "fulfillmentMode": facts.mode,
        "request": _request_json(facts, now),
        "nodes": _nodes_json(facts),
        "nodeClaims": _claims_json(report.claims),
        "start": (
            None
            if facts.start is None
            else {"scheduled": facts.start.scheduled, "members": facts.start.total}
        ),
        "verdict": {
            "blocked": report.verdict.blocked,
            "step": report.verdict.step,
            "reason": report.verdict.reason,
            "line": report.verdict.line,
        },
    }


def _quota_json(facts: Facts) -> dict[str, Any]:
    st = facts.state
    cond = st.quota_condition
    return {
        "reserved": st.reserved,
        "admitted": st.admitted,
        "active": st.active,
        "clusterQueue": st.cluster_queue,
        "localQueue": st.local_queue,
        "reason": cond.reason if cond else "",
        "message": cond.message if cond else "",
        "requeueAt": format_time(st.requeue_at) if st.requeue_at else None,
    }


def _group_json(report: GroupReport) -> dict[str, Any]:
    f, now, m = report.facts, report.now, report.facts.members
    return {
        "kind": "PodGroupDiagnosis",
        "target": str(report.target),
        "via": str(report.via) if report.via else None,
        "time": format_time(now),
        "podGroup": {
            "namespace": f.namespace,
            "name": f.name,
            "apiGroup": f.api_group,
            "apiVersion": f.api_version,
            "found": f.found,
            "served": f.served,
            "minCount": f.min_count,
            "gang": f.is_gang,
            "topologyKey": f.topology_key,
            "config": f.config,
            "problem": f.problem,
        },
        "state": {
            "state": f.state,
            "message": f.message,
            "attempt": f.attempt,
            "request": f.request_name,
            "nextAttemptAt": format_time(f.next_attempt_at) if f.next_attempt_at else None,
            "reportedUngated": list(f.reported_ungated),
        },
        "members": {
            "exist": m.exist,
            "minCount": m.min_count,
            "gated": list(m.gated),
            "bound": list(m.bound),
            "ungated": list(m.ungated),
            "late": list(f.late),
            "namespaceOptedIn": f.opted_in,
        },
        "request": _request_facts_json(f.request, now),
        "nodes": _placement_json(f.placement),
        "nodeClaims": _claims_json(report.claims),
        "verdict": {
            "blocked": report.verdict.blocked,
            "step": report.verdict.step,
            "reason": report.verdict.reason,
            "line": report.verdict.line,
        },
    }


def _request_json(facts: Facts, now: datetime) -> dict[str, Any] | None:
    return _request_facts_json(facts.request, now)


def _request_facts_json(req: RequestFacts | None, now: datetime) -> dict[str, Any] | None:
    if req is None:
        return None
    left = (req.deadline - now).total_seconds() if req.deadline else None
    return {
        "name": req.name,
        "attempt": req.attempt,
        "found": req.found,
        "conditions": [
            {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message}
            for c in req.conditions.values()
        ],
        "phase": req.phase,
        "deadline": format_time(req.deadline) if req.deadline else None,
        "secondsLeft": int(left) if left is not None else None,
        "rollbackReason": req.rollback_reason,
        "outcome": json.loads(req.outcome.to_annotation()) if req.outcome else None,
    }


def _claims_json(claims: NodeClaimFacts | None) -> dict[str, Any] | None:
    if claims is None:
        return None
    return {
        "readable": claims.readable,
        "problem": claims.problem or None,
        "asked": claims.asked,
        "arrived": claims.arrived if claims.readable else None,
        "summary": claims.line,
        "claims": [
            {
                "name": c.name,
                "nodePool": c.node_pool,
                "phase": c.phase,
                "node": c.node or None,
                "message": c.message,
            }
            for c in claims.claims
        ],
    }


def _nodes_json(facts: Facts) -> dict[str, Any] | None:
    return _placement_json(facts.placement)


def _placement_json(placement: Placement | None) -> dict[str, Any] | None:
    if placement is None:
        return None
    return {
        "placeable": placement.placeable,
        "members": placement.total,
        "fits": placement.fits,
        "arrived": [n.name for n in placement.arrived],
        "summary": placement.summary,
        "perNode": [
            {
                "name": n.name,
                "arrived": n.arrived,
                "recorded": n.recorded,
                "members": n.members,
                "reason": n.reason,
                "kind": n.kind,
            }
            for n in placement.nodes
        ],
    }


# ---- entry points ------------------------------------------------------------------------


def main_diagnose(argv: Sequence[str] | None = None) -> int:
    parser = _parser("diagnose", "Say what blocks a gang, walking quota -> check -> nodes.")
    parser.add_argument(
        "target",
        metavar="TARGET",
        help="KIND/NAMESPACE/NAME; KIND is job, workload, pod or podgroup (the upstream "
        "PodGroup, else the scheduler-plugins one; podgroup.scheduling.x-k8s.io for that one)",
    )
    args = parser.parse_args(argv)
    try:
        _parse(args.target)  # a malformed target fails before any connection
    except DiagnoseError as e:
        return _fail(str(e))
    return _main(args, lambda kube: diagnose(kube, args.target))


def main_status(argv: Sequence[str] | None = None) -> int:
    parser = _parser("status", "List the gangs in flight and where each one stands.")
    parser.add_argument("-n", "--namespace", help="only this namespace (default: all)")
    args = parser.parse_args(argv)
    return _main(args, lambda kube: status(kube, args.namespace))


def _parser(command: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"gangcheck {command}", description=description)
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG)")
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
    return parser


def _main(
    args: argparse.Namespace,
    work: Callable[[Kube], Awaitable[Report | StatusReport]],
) -> int:
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        return _fail(f"kubeconfig {args.kubeconfig} not found")
    try:
        report = asyncio.run(_with_kube(args.kubeconfig, work))
    except DiagnoseError as e:
        return _fail(str(e))
    except ApiError as e:
        if e.status == 0:
            return _fail(f"cannot reach the API server: {e.message}")
        return _fail(f"the API server answered {e.status} {e.reason}: {e.message}")
    if args.output == "json":
        print(json.dumps(to_json(report), indent=2))
    else:
        print(render_text(report), end="")
    return 0


async def _with_kube(kubeconfig: str | None, work: Callable[[Kube], Awaitable[R]]) -> R:
    try:
        kube = await Kube.connect(kubeconfig)
    except Exception as e:  # the client's config errors are its own types; one line suffices
        raise DiagnoseError(f"cannot load the kubeconfig: {e}") from e
    async with kube:
        return await work(kube)


def _fail(message: str) -> int:
    print(f"gangcheck: {message.splitlines()[0] if message else 'failed'}", file=sys.stderr)
    return 1
