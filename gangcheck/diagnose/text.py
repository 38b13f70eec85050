"""A report as text, for a person."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from datetime import datetime

from gangcheck.diagnose.reports import DiagnoseReport, GroupReport, Report, StatusReport
from gangcheck.logic.attempt.explain import NodeFit, Placement, RequestFacts, human_duration
from gangcheck.logic.attempt.status import CONDITION_TYPES
from gangcheck.logic.dispatch import describe
from gangcheck.logic.podgroups.gating import OPT_IN_VALUE
from gangcheck.logic.podgroups.group_diagnosis import GroupFacts, GrowthFacts, StartWatch
from gangcheck.logic.podgroups.podgroup import RELEASED
from gangcheck.logic.sources.karpenter.explain import NodeClaimFacts, claim_rows
from gangcheck.logic.timefmt import format_time
from gangcheck.logic.workloads.diagnosis import (
    Ended,
    Facts,
    earlier_attempts,
    reset_from,
    turn_line,
)
from gangcheck.model.names import FULFILLED, GATE, OPT_IN_LABEL, UNGATED_ANNOTATION

NODES_SHOWN = 24
WIDTH = 100


def render_text(report: Report | StatusReport) -> str:
    return _controller_text(report.controller) + _report_text(report)


def _report_text(report: Report | StatusReport) -> str:
    if isinstance(report, StatusReport):
        return _status_text(report)
    if isinstance(report, GroupReport):
        return "\n".join(_group_lines(report)) + "\n"
    return "\n".join(_diagnosis_lines(report)) + "\n"


def _controller_text(down: str) -> str:
    """First, when no gangcheck acts here: what follows is what it would do, not what it does."""
    if not down:
        return ""
    said = f"{down}: no gangcheck acts on these gangs now; what follows is what it would do"
    return "\n".join(["WARNING", *_wrapped(said, indent=2), ""]) + "\n"


def _diagnosis_lines(report: DiagnoseReport) -> list[str]:
    facts, now = report.facts, report.now
    head = f"Workload {report.workload}"
    if report.target.kind != "workload":
        head = f"{report.target.kind.capitalize()} {report.target.namespace}/"
        head += f"{report.target.name} -> Workload {report.workload}"
    lines = [head, ""]
    lines += _section("quota", _quota_lines(facts, now))
    lines += _section("checks", _check_lines(facts))
    lines += _section("earlier", _earlier_lines(earlier_attempts(facts)))
    if report.dispatch is not None:
        lines += _section("dispatch", describe(report.dispatch))
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


def _earlier_lines(turns: Sequence[Ended]) -> list[str]:
    """The attempts ended before the one in flight, as the Events tell: a line each."""
    return [w for t in turns for w in _wrapped(turn_line(t))]


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
        ended = reset_from(facts) if c.name == facts.focus else None
        if ended is not None:  # why it was Retry or Rejected, from the Workload's Events
            when = f" at {format_time(ended.at)}" if ended.at else ""
            out += _wrapped(f"{ended.state}{when}: {ended.message or '(no message)'}", indent=2)
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
    if req.deadline is not None and not req.phase:  # a deadline past its phase holds nothing
        when = f"; deadline {format_time(req.deadline)} ({_relative(req.deadline, now)})"
    lines.append(f"  phase {req.phase or '-'}{when}")
    if req.source or req.domain:
        asked = f"#{req.source + 1} ({req.class_name})"
        if req.source_name:  # as messages, Events and metrics name it
            asked = f"'{req.source_name}' (#{req.source + 1}, {req.class_name})"
        place = [f"capacity source {asked}"] if req.source else []
        place += [f"topology domain {req.domain}"] if req.domain else []
        left = ", ".join(d or '""' for d in req.domains_tried)  # "": the empty label value
        tried = f"; domains left before: {left}" if req.domains_tried else ""
        lines.append(f"  asks {' in '.join(reversed(place))}{tried}")
    if req.rollback_reason:
        lines += _wrapped(f"rollback: {req.rollback_reason}", indent=2)
    if req.outcome is not None:
        lines += _wrapped(f"outcome: {req.outcome_line}", indent=2)
    if req.deleting:
        lines += _wrapped(req.deletion(now), indent=2)
    return lines


def _node_lines(facts: Facts) -> list[str]:
    assert facts.placement is not None
    return _lines_of_placement(facts.placement)


def _lines_of_placement(placement: Placement) -> list[str]:
    arrived = placement.arrived
    unrecorded = sum(1 for n in arrived if not n.recorded)
    head = f"{len(arrived)} arrived" + (f" ({unrecorded} not recorded yet)" if unrecorded else "")
    placeable = f"{placement.placeable} of {placement.total} members placeable"
    if placement.missing_level is not None:
        none = "none" if placement.nodes else "no node"
        key = placement.missing_level.key
        placeable = f"{none} carries the required topology level {key}; {placeable} ignoring it"
    lines = [f"{head}; {placeable}"]
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
        lines += _section("earlier", _earlier_lines(report.earlier))
    lines += _section("members", _member_lines(f))
    if f.request is not None:
        started = _start_lines(f.start, now) if f.start is not None else []
        lines += _section("request", _lines_of_request(f.namespace, f.request, now) + started)
    if f.growth is not None:
        lines += _section("growth", _growth_lines(f.namespace, f.growth, now))
    if f.placement is not None:
        lines += _section("nodes", _lines_of_placement(f.placement))
    if report.claims is not None:
        lines += _section("claims", _claim_lines(report.claims))
    return [*lines, "", report.verdict.line]


def _growth_lines(namespace: str, grown: GrowthFacts, now: datetime) -> list[str]:
    """The latest growth: its request (the rollback's reason and outcome there); once
    delivered, its members and their start deadline; the gated members waiting on it and,
    rolled back, when the next growth is asked."""
    lines = _lines_of_request(namespace, grown.request, now)
    watch = grown.watch
    if grown.delivered:
        released = f" at {format_time(watch.released_at)}" if watch.released_at else ""
        count = len(watch.members)
        lines.append(
            f"{count} member{'s' if count != 1 else ''} released onto it{released}: "
            f"{len(watch.bound)} bound"
        )
        lines += _start_lines(watch, now)
    if grown.gated:
        beyond = f" ({len(grown.beyond)} beyond it)" if grown.beyond and grown.asks else ""
        lines += _wrapped(f"gated members waiting on it{beyond}: {', '.join(grown.gated)}")
    if grown.next_at is not None:
        lines.append(
            f"next growth asked at {format_time(grown.next_at)} ({_relative(grown.next_at, now)})"
        )
    if grown.no_more:
        lines.append("backoffLimitCount allows no more growth")
    if grown.placement is not None:
        lines += ["fit of the members it asks for:", *_lines_of_placement(grown.placement)]
    return lines


def _start_lines(watch: StartWatch, now: datetime) -> list[str]:
    """The start deadline of members released together while they bind (the gang's or a
    growth's), or once passed, its rollback begun now."""
    deadline = watch.start_deadline
    if deadline is None or not (watch.watched or (watch.rolled_back and watch.phase == FULFILLED)):
        return []
    then = "rolled back unless all are bound by then"
    if not watch.watched:  # passed, its rollback not recorded yet: the decision begins it
        then = "passed, gangcheck begins its rollback"
    return _wrapped(
        f"start deadline {format_time(deadline)} ({_relative(deadline, now)}, "
        f"startDeadlineSeconds {watch.start_deadline_seconds}): {then}"
    )


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
    if not report.gangs and not report.workers:
        where = f" in namespace {report.namespace}" if report.namespace else ""
        return f"No gangs in flight{where}.\n"
    text = _gangs_text(report) if report.gangs else ""
    if report.workers:
        text += ("\n" if text else "") + _workers_text(report)
    return text


def _workers_text(report: StatusReport) -> str:
    """A MultiKueue manager's gangs per worker cluster."""
    head = ["WORKER", "NAMESPACE/NAME", "PLACEMENT", "CHECK", "STATE", "AGE", "DETAIL"]
    rows = [head]
    for w in report.workers:
        rows.append(
            [
                w.worker or "(none)",
                f"{w.namespace}/{w.name}",
                w.placement,
                w.check or "-",
                w.state or "-",
                human_duration(w.age_seconds) if w.age_seconds is not None else "-",
                _cut(w.detail, 80) or "-",
            ]
        )
    return "Across worker clusters (MultiKueue):\n" + "\n".join(_table(rows)) + "\n"


def _gangs_text(report: StatusReport) -> str:
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
    """Wrapped at spaces only: a name (a node's, a request's) or a word is never cut in two
    (at a hyphen, or for being long), so what is named can be copied from the text."""
    pad = " " * indent
    return (
        textwrap.wrap(
            text,
            WIDTH - 10,
            initial_indent=pad,
            subsequent_indent=pad + "  ",
            break_on_hyphens=False,
            break_long_words=False,
        )
        or []
    )


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _relative(when: datetime, now: datetime) -> str:
    left = (when - now).total_seconds()
    return f"in {human_duration(left)}" if left >= 0 else f"{human_duration(-left)} ago"
