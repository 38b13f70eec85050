"""A report as JSON (`-o json`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from gangcheck.diagnose.reports import DiagnoseReport, GroupReport, Report, StatusReport
from gangcheck.logic.attempt import deletion
from gangcheck.logic.attempt.explain import GangRow, Placement, RequestFacts
from gangcheck.logic.podgroups.group_diagnosis import GroupReplay, GrowthFacts, StartWatch
from gangcheck.logic.sources.karpenter.explain import NodeClaimFacts
from gangcheck.logic.timefmt import format_time
from gangcheck.logic.workloads.diagnosis import (
    Ended,
    Facts,
    Replay,
    earlier_attempts,
    reset_from,
    turn_line,
)


def to_json(report: Report | StatusReport) -> dict[str, Any]:
    """The report as JSON; `controllerDown`: why no gangcheck acts here (null when it does, or
    when that cannot be told)."""
    return {**_report_json(report), "controllerDown": report.controller or None}


def _report_json(report: Report | StatusReport) -> dict[str, Any]:
    if isinstance(report, StatusReport):
        return {
            "kind": "GangStatusList",
            "namespace": report.namespace,
            "time": format_time(report.now),
            "items": [_row_json(g) for g in report.gangs],
            "workers": [
                {
                    "worker": w.worker or None,
                    "namespace": w.namespace,
                    "name": w.name,
                    "placement": w.placement,
                    "check": w.check,
                    "state": w.state,
                    "ageSeconds": w.age_seconds,
                    "detail": w.detail,
                }
                for w in report.workers
            ],
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
        "membersNote": g.members_note or None,
        "given": g.given,
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
        "checkEnded": _ended_json(facts),
        "earlierAttempts": _earlier_json(earlier_attempts(facts)),
        "fulfillmentMode": facts.mode,
        "request": _request_json(facts, now),
        "nodes": _nodes_json(facts),
        "nodeClaims": _claims_json(report.claims),
        "start": (
            None
            if facts.start is None
            else {"scheduled": facts.start.scheduled, "members": facts.start.total}
        ),
        "decision": _decision_json(facts.replay),
        "dispatch": (
            None
            if report.dispatch is None
            else {
                "nominated": list(report.dispatch.nominated),
                "tried": list(report.dispatch.tried),
                "failed": dict(report.dispatch.failed),
                "skipped": dict(report.dispatch.skipped),
                "reason": report.dispatch.reason,
            }
        ),
        "verdict": {
            "blocked": report.verdict.blocked,
            "step": report.verdict.step,
            "reason": report.verdict.reason,
            "line": report.verdict.line,
        },
    }


def _earlier_json(turns: Sequence[Ended]) -> list[dict[str, Any]]:
    """The attempts ended before the one in flight, as the Events tell (the text's `earlier`)."""
    return [
        {
            "attempt": t.attempt,
            "state": t.state,
            "message": t.message,
            "at": format_time(t.at) if t.at else None,
            "line": turn_line(t),
        }
        for t in turns
    ]


def _ended_json(facts: Facts) -> dict[str, Any] | None:
    """The focus check's last Retry or Rejected, from the Workload's Events (null when Kueue
    did not reset the check from one, or no Event of it is left): why it was."""
    ended = reset_from(facts)
    if ended is None:
        return None
    at = format_time(ended.at) if ended.at else None
    return {"state": ended.state, "message": ended.message, "at": at}


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
        "evicted": (
            None
            if st.evicted is None
            else {"reason": st.evicted.reason, "message": st.evicted.message}
        ),
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
        "earlierAttempts": _earlier_json(report.earlier),
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
        "start": _start_json(f.start, now),
        "growth": _growth_json(f.growth, now),
        "nodes": _placement_json(f.placement),
        "nodeClaims": _claims_json(report.claims),
        "decision": _decision_json(f.replay),
        "verdict": {
            "blocked": report.verdict.blocked,
            "step": report.verdict.step,
            "reason": report.verdict.reason,
            "line": report.verdict.line,
        },
    }


def _start_json(watch: StartWatch | None, now: datetime) -> dict[str, Any] | None:
    """Members released together onto a request (null: none): how many are bound, and the
    start deadline while they bind (`watched`; `secondsLeft` to it)."""
    if watch is None:
        return None
    deadline = watch.start_deadline
    return {
        "members": list(watch.members),
        "bound": list(watch.bound),
        "releasedAt": format_time(watch.released_at) if watch.released_at else None,
        "startDeadlineSeconds": watch.start_deadline_seconds,
        "startDeadline": format_time(deadline) if deadline else None,
        "secondsLeft": int((deadline - now).total_seconds()) if deadline else None,
        "watched": watch.watched,
    }


def _growth_json(grown: GrowthFacts | None, now: datetime) -> dict[str, Any] | None:
    """The latest growth (null: none): its request; in flight or rolled back, the gated
    members it asks (asked) for, those beyond it, their fit, when the next is asked
    (`nextAt`, `noMore`); once its members were released onto it (`delivered`), they and its
    start deadline, and why its start watchdog rolled it back (`rolledBack`)."""
    if grown is None:
        return None
    start = _start_json(grown.watch, now) or {}
    if not grown.delivered:  # no member released onto it: nothing to watch
        start = dict.fromkeys(start)
    return {
        "request": _request_facts_json(grown.request, now),
        "delivered": grown.delivered,
        **start,
        "rolledBack": grown.watch.rolled_back or None,
        "asks": list(grown.asks),
        "gated": list(grown.gated),
        "beyond": list(grown.beyond),
        "nodes": _placement_json(grown.placement),
        "nextAt": format_time(grown.next_at) if grown.next_at else None,
        "noMore": grown.no_more,
    }


def _decision_json(replay: Replay | GroupReplay | None) -> dict[str, Any] | None:
    """The controller's decision replayed on what was read: where the attempt it follows
    stands (`progress`, null when it follows none), and the state and message it leaves."""
    if replay is None:
        return None
    return {
        "progress": replay.progress.value if replay.progress is not None else None,
        "state": replay.state,
        "message": replay.message,
        "asks": replay.asks,
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
        "outcome": _outcome_json(req),
        "deletion": _deletion_json(req, now),
        "className": req.class_name,
        "capacitySource": req.source,
        "capacitySourceName": req.source_name or None,
        "topologyDomain": req.domain or None,
        "domainsTried": list(req.domains_tried),
    }


def _outcome_json(req: RequestFacts) -> dict[str, Any] | None:
    """Its rollback's outcome as recorded, the kept nodes gone since (`keptGone`), and the
    line the text says (`summary`)."""
    if req.outcome is None:
        return None
    recorded = json.loads(req.outcome.to_annotation())
    return {**recorded, "keptGone": list(req.kept_gone), "summary": req.outcome_line}


def _deletion_json(req: RequestFacts, now: datetime) -> dict[str, Any] | None:
    """Its deletion (null when it is not being deleted): since when, the finalizers that
    hold it, whether it is past the grace (the gang's message says it then, with a
    RequestStuckDeleting Warning), and the line the text says."""
    if not req.deleting:
        return None
    return {
        "since": format_time(req.deleted_at) if req.deleted_at else None,
        "finalizers": list(req.finalizers),
        "stuck": bool(deletion.line(req.name, req.finalizers, req.deleted_at, now)),
        "line": req.deletion(now),
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
        "missingTopologyLevel": _missing_level_json(placement),
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


def _missing_level_json(placement: Placement) -> dict[str, str] | None:
    """The required topology level none of the nodes carries: its key, and the pod set that
    requires it ("" for the whole gang, a PodGroup's topology)."""
    missing = placement.missing_level
    return None if missing is None else {"key": missing.key, "podSet": missing.pod_set}
