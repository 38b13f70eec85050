"""`gangcheck diagnose TARGET` and `gangcheck status`: read the cluster, say what blocks a gang.

This module fetches (with ``Kube``) and renders; ``gangcheck.logic.diagnosis`` judges. The
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
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError, ForbiddenError, NotFoundError
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    ATOMIC_CONFIG,
    CLUSTER_QUEUE,
    JOB,
    LOCAL_QUEUE,
    NODE,
    POD,
    PROVISIONING_REQUEST,
    RESOURCE_FLAVOR,
    WORKLOAD,
    Resource,
)
from gangcheck.logic.actions import MANAGED_BY, MANAGED_BY_LABEL
from gangcheck.logic.diagnosis import (
    REQUEST_CONDITIONS,
    Facts,
    GangRow,
    NodeFit,
    Target,
    TargetError,
    Verdict,
    World,
    gang_row,
    gather,
    human_duration,
    is_gang,
    parse_target,
    verdict,
)
from gangcheck.logic.timefmt import format_time
from gangcheck.model.objects import flavor_of

Obj = dict[str, Any]
R = TypeVar("R")


# Where Kueue v0.17 records a pod's Workload (sigs.k8s.io/kueue apis/kueue/v1beta2,
# pkg/controller/constants, pkg/controller/jobs/pod/constants).
WORKLOAD_NAME_ANNOTATION = "kueue.x-k8s.io/workload"
PREBUILT_WORKLOAD_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
NOT_FINISHED = "status.phase!=Succeeded,status.phase!=Failed"
NODES_SHOWN = 24
WIDTH = 100


class DiagnoseError(Exception):
    """The target cannot be diagnosed: missing, not a gang, or a kind not served yet."""


@dataclass(frozen=True)
class DiagnoseReport:
    target: Target
    facts: Facts
    verdict: Verdict
    now: datetime

    @property
    def workload(self) -> str:
        return f"{self.facts.namespace}/{self.facts.name}"


@dataclass(frozen=True)
class StatusReport:
    namespace: str | None
    gangs: tuple[GangRow, ...]
    now: datetime


# ---- the API -----------------------------------------------------------------------------


async def diagnose(kube: Kube, target: str, *, now: datetime | None = None) -> DiagnoseReport:
    """Find the target's Workload and walk its chain; DiagnoseError when there is none."""
    parsed = _parse(target)
    workload = await find_workload(kube, parsed)
    world = await fetch_world(kube, parsed.namespace)
    when = now or datetime.now(UTC)
    facts = gather(workload, world)
    return DiagnoseReport(parsed, facts, verdict(facts, when), when)


async def status(
    kube: Kube, namespace: str | None = None, *, now: datetime | None = None
) -> StatusReport:
    """Every gang in flight (a Workload one of our checks cares about, not finished)."""
    workloads, world = await asyncio.gather(
        _items(kube, WORKLOAD, namespace), fetch_world(kube, namespace)
    )
    when = now or datetime.now(UTC)
    rows = [
        gang_row(gather(wl, world), when)
        for wl in workloads
        if is_gang(wl, world) and not _is_finished(wl)
    ]
    rows.sort(key=lambda r: (r.namespace, r.name))
    return StatusReport(namespace, tuple(rows), when)


def _parse(target: str) -> Target:
    try:
        parsed = parse_target(target)
    except TargetError as e:
        raise DiagnoseError(str(e)) from e
    if parsed.kind == "podgroup":
        raise DiagnoseError("PodGroup provisioning is not implemented yet")
    return parsed


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
        raise DiagnoseError(
            f"Pod {target.namespace}/{target.name} is not a gang: no Kueue Workload belongs to "
            "it or to its owners"
        )
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
        _items(kube, ADMISSION_CHECK),
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
    )


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


def render_text(report: DiagnoseReport | StatusReport) -> str:
    if isinstance(report, StatusReport):
        return _status_text(report)
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
    req = facts.request
    assert req is not None
    where = f"{facts.namespace}/{req.name} (attempt {req.attempt})"
    if not req.found:
        return [f"{where}: not found"]
    lines = [where]
    rows = [
        [kind, c.status, c.reason, _cut(c.message, 60)]
        for kind in REQUEST_CONDITIONS
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
    placement = facts.placement
    assert placement is not None
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


def _status_text(report: StatusReport) -> str:
    if not report.gangs:
        where = f" in namespace {report.namespace}" if report.namespace else ""
        return f"No gangs in flight{where}.\n"
    rows = [["NAMESPACE/NAME", "CHECK", "STATE", "PHASE", "ATTEMPT", "AGE", "NODES", "MEMBERS"]]
    for g in report.gangs:
        rows.append(
            [
                f"{g.namespace}/{g.name}",
                g.check or "-",
                g.state or "-",
                g.phase,
                str(g.attempt) if g.attempt else "-",
                human_duration(g.age_seconds) if g.age_seconds is not None else "-",
                f"{g.arrived}/{g.needed if g.needed is not None else '?'}",
                f"{g.placeable}/{g.total}" if g.placeable is not None else "-",
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


def to_json(report: DiagnoseReport | StatusReport) -> dict[str, Any]:
    if isinstance(report, StatusReport):
        return {
            "kind": "GangStatusList",
            "namespace": report.namespace,
            "time": format_time(report.now),
            "items": [_row_json(g) for g in report.gangs],
        }
    return _diagnosis_json(report)


def _row_json(g: GangRow) -> dict[str, Any]:
    return {
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


def _request_json(facts: Facts, now: datetime) -> dict[str, Any] | None:
    req = facts.request
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


def _nodes_json(facts: Facts) -> dict[str, Any] | None:
    placement = facts.placement
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
        "target", metavar="TARGET", help="KIND/NAMESPACE/NAME; KIND is job, workload or pod"
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
    work: Callable[[Kube], Awaitable[DiagnoseReport | StatusReport]],
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
