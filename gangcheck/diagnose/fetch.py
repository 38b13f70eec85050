"""Reading the cluster: find the target's gang, fetch what its diagnosis reads (with `Kube`),
and judge it (the pure judgement is in `gangcheck.logic`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypedDict

from gangcheck.diagnose.earlier import group_attempts
from gangcheck.diagnose.reports import (
    DiagnoseError,
    DiagnoseReport,
    GroupReport,
    PodGroupMember,
    PodGroups,
    Report,
    StatusReport,
)
from gangcheck.kube.client import Kube
from gangcheck.kube.discovery import ServedPodGroups, served_pod_group_apis
from gangcheck.kube.errors import ApiError, ForbiddenError, NotFoundError
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    ATOMIC_CONFIG,
    CLUSTER_QUEUE,
    DEVICE_CLASS,
    EVENT,
    JOB,
    LEASE,
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
from gangcheck.logic.attempt.explain import GangRow, RequestFacts, World, node_names
from gangcheck.logic.dispatch import (
    MULTIKUEUE_CONTROLLER,
    RECORD_ANNOTATION,
    DispatchRecord,
    lease_down,
    worker_rows,
)
from gangcheck.logic.podgroups.gating import OPT_IN_VALUE, group_of
from gangcheck.logic.podgroups.group_diagnosis import (
    GroupFacts,
    gather_group,
    group_row,
    group_verdict,
    in_flight,
    members_by_group,
)
from gangcheck.logic.sources.karpenter.explain import (
    ANY_ATTEMPT,
    NodeClaimFacts,
    attempt_key,
    attempt_selector,
    is_karpenter,
    request_claims,
    unreadable,
)
from gangcheck.logic.sources.world import capacity_of
from gangcheck.logic.workloads.admission import CHECK_UPDATED
from gangcheck.logic.workloads.diagnosis import (
    Target,
    TargetError,
    gang_row,
    gather,
    is_gang,
    parse_target,
    verdict,
)
from gangcheck.model.names import (
    JOB_UID_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    OPT_IN_LABEL,
    POD_GROUP_LABEL,
    PREBUILT_WORKLOAD_LABEL,
    QUEUE_LABEL,
    WORKLOAD_NAME_ANNOTATION,
)
from gangcheck.model.objects import Obj, flavor_of, labels_of
from gangcheck.model.podgroups import PLUGINS, UPSTREAM, pod_group_of
from gangcheck.settings import LEASE_NAME, LEASE_NAMESPACE

NOT_FINISHED = "status.phase!=Succeeded,status.phase!=Failed"


# ---- the API -----------------------------------------------------------------------------


async def diagnose(kube: Kube, target: str, *, now: datetime | None = None) -> Report:
    """Find the target's gang (a Workload, or a PodGroup) and walk its chain; DiagnoseError
    when there is none."""
    parsed = target_of(target)
    if parsed.kind == "podgroup":
        return await diagnose_group(kube, parsed, now=now)
    try:
        workload = await find_workload(kube, parsed)
    except PodGroupMember as e:
        group = Target("podgroup", parsed.namespace, e.group.name, e.group.api_group)
        return await diagnose_group(kube, group, now=now, via=parsed)
    world, events = await asyncio.gather(
        fetch_world(kube, parsed.namespace), _events_on(kube, workload)
    )
    when = now or datetime.now(UTC)
    facts = gather(workload, world, now=when, events=events)
    claims = await attempt_node_claims(kube, facts.namespace, facts.request)
    raw = (workload["metadata"].get("annotations") or {}).get(RECORD_ANNOTATION)
    dispatch = DispatchRecord.from_annotation(raw) if raw else None
    return DiagnoseReport(parsed, facts, verdict(facts, when), when, claims, dispatch)


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
    world, namespace, events = await asyncio.gather(
        fetch_group_world(kube, ns),
        _namespace(kube, ns),
        _events_on(kube, obj or {}),
    )
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
        opted_in=_is_opted_in(namespace) if namespace is not None else None,
        namespace_labels=labels_of(namespace) if namespace is not None else None,
        now=when,
    )
    claims = await attempt_node_claims(kube, ns, facts.request)
    earlier = (
        group_attempts(events, pod_group_of(obj), facts.attempt, facts.message, node_names(world))
        if obj is not None
        else ()
    )
    found = group_verdict(facts, when)
    return GroupReport(target, facts, found, when, via, claims, earlier=earlier)


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


async def controller_down(
    kube: Kube, now: datetime, lease: tuple[str, str] = (LEASE_NAMESPACE, LEASE_NAME)
) -> str:
    """Why no gangcheck controller acts in this cluster, from its leader Lease (`lease`:
    namespace, name), by the rule the dispatcher reads a worker's with (`dispatch.lease_down`:
    not renewed for its duration plus a grace); '' when it is renewed, or when that cannot be
    told (no Lease: gangcheck not installed, or running without leader election; not
    readable with the caller's rights)."""
    namespace, name = lease
    try:
        got = await kube.get_if_exists(LEASE, name, namespace)
    except ApiError:
        return ""
    down = lease_down(got, now, name=lease)
    return down.failure if down is not None else ""


async def status(
    kube: Kube, namespace: str | None = None, *, now: datetime | None = None
) -> StatusReport:
    """Every gang in flight: a Workload one of our checks cares about, not finished; a
    PodGroup gangcheck keeps a state on or holds members of."""
    workloads, world, groups, namespaces, updates = await asyncio.gather(
        _items(kube, WORKLOAD, namespace, optional=True),
        fetch_world(kube, namespace),
        _pod_groups(kube, namespace),
        _maybe(kube, NAMESPACE, None),
        _check_updates(kube, namespace),
    )
    when = now or datetime.now(UTC)
    gangs = [
        gather(wl, world, now=when, events=updates.get(_uid(wl), ()))
        for wl in workloads
        if is_gang(wl, world) and not _is_finished(wl)
    ]
    rows = [(gang_row(facts, when), facts.request) for facts in gangs]
    by_name = None if namespaces is None else {_name(n): n for n in namespaces}
    rows += [
        (group_row(facts, when), facts.request)
        for facts in _group_facts(groups, world, namespace, by_name, now=when)
        if in_flight(facts)
    ]
    with_claims = await _with_claims(kube, rows)
    with_claims.sort(key=lambda r: (r.namespace, r.name, r.kind))
    multikueue = [
        name
        for name, check in world.admission_checks.items()
        if (check.get("spec") or {}).get("controllerName") == MULTIKUEUE_CONTROLLER
    ]
    workers = worker_rows(workloads, multikueue, when)
    return StatusReport(namespace, tuple(with_claims), when, tuple(workers))


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
    namespaces: dict[str, Obj] | None,
    *,
    now: datetime,
) -> list[GroupFacts]:
    """Every PodGroup listed, and every PodGroup gated members name that does not exist.
    `namespaces` by name (None: not readable)."""
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
                **_namespace_facts(namespaces, key[0]),
                now=now,
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
                **_namespace_facts(namespaces, ns),
                now=now,
            )
        )
    return out


def target_of(target: str) -> Target:
    """The target a `TARGET` argument names; DiagnoseError when it is malformed."""
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
    world = World(
        admission_checks=_by_key(checks),
        configs=_by_key(configs),
        flavors={f["metadata"]["name"]: flavor_of(f) for f in flavors},
        requests=tuple(requests),
        nodes=tuple(nodes),
        pods=tuple(pods),
        cluster_queues=_by_key(cqs) if cqs is not None else None,
        local_queues=_by_key(lqs) if lqs is not None else None,
        node_claims=await _every_node_claim(kube),
        **_device_fields(await _devices(kube)),
    )
    return capacity_of(world)  # the requests in flight and waiting, worked out once


async def fetch_group_world(kube: Kube, namespace: str) -> World:
    """What a PodGroup's diagnosis reads: the requests in flight, the nodes, the pods, the
    configs (a group names one; none when they cannot be read)."""
    managed = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
    requests, nodes, pods, configs = await asyncio.gather(
        _everywhere(kube, PROVISIONING_REQUEST, namespace, label_selector=managed),
        _items(kube, NODE),
        _everywhere(kube, POD, namespace, field_selector=NOT_FINISHED),
        _maybe(kube, ATOMIC_CONFIG, None),
    )
    world = World(
        configs=_by_key(configs or []),
        requests=tuple(requests),
        nodes=tuple(nodes),
        pods=tuple(pods),
        node_claims=await _every_node_claim(kube),
        **_device_fields(await _devices(kube)),
    )
    return capacity_of(world)


async def _events_on(kube: Kube, obj: Obj) -> list[Obj]:
    """The Events on the object (by its uid), for what its status no longer says (a check
    Kueue reset from Retry or Rejected, a PodGroup's earlier attempts); none when they may not
    be read, or it has no uid (none read)."""
    meta = obj.get("metadata") or {}
    uid, namespace = meta.get("uid"), meta.get("namespace")
    if not uid or not namespace:
        return []
    try:
        return await _items(kube, EVENT, namespace, field_selector=f"involvedObject.uid={uid}")
    except ApiError:
        return []


async def _check_updates(kube: Kube, namespace: str | None) -> dict[str, list[Obj]]:
    """gangcheck's CHECK_UPDATED Events, by the uid of the Workload they are on (what
    `_events_on` reads of one, for every row of `status`); none when they may not be read."""
    try:
        listed = await _everywhere(kube, EVENT, namespace, field_selector=f"reason={CHECK_UPDATED}")
    except ApiError:
        return {}
    out: dict[str, list[Obj]] = {}
    for event in listed:
        uid = str((event.get("involvedObject") or {}).get("uid") or "")
        out.setdefault(uid, []).append(event)
    return out


def _uid(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


async def _every_node_claim(kube: Kube) -> tuple[Obj, ...]:
    """Karpenter's NodeClaims (a node whose claim is being deleted is going), as the
    controller's cache holds them: none where Karpenter is not served or they may not be
    listed."""
    try:
        return tuple(await _items(kube, NODE_CLAIM, optional=True))
    except ForbiddenError:
        return ()


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


async def _namespace(kube: Kube, namespace: str) -> Obj | None:
    """The namespace, for whether it opted in to gating and which configs serve it (None:
    it cannot be read)."""
    try:
        return await _get(kube, NAMESPACE, namespace, None)
    except ApiError:
        return None


class _NamespaceFacts(TypedDict):
    opted_in: bool | None
    namespace_labels: dict[str, str] | None


def _namespace_facts(namespaces: dict[str, Obj] | None, name: str) -> _NamespaceFacts:
    """What `gather_group` reads of the group's namespace: None for each when not read."""
    found = namespaces.get(name) if namespaces is not None else None
    if found is None:
        return {"opted_in": None, "namespace_labels": None}
    return {"opted_in": _is_opted_in(found), "namespace_labels": labels_of(found)}


def _is_opted_in(namespace: Obj) -> bool:
    return labels_of(namespace).get(OPT_IN_LABEL) == OPT_IN_VALUE


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
