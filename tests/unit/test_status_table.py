"""What `gangcheck status` and `gangcheck diagnose` print: only what is known, in words.

Pure: the rows and reports are built from facts (tests/unit/test_group_diagnosis.py builds
the same facts); the commands' I/O is proven in tests/integration/test_diagnose*.py."""

from __future__ import annotations

from datetime import UTC, datetime

from gangcheck.diagnose import GroupReport, StatusReport, render_text
from gangcheck.logic.attempt.explain import GangRow
from gangcheck.logic.podgroups.group_diagnosis import group_row, group_verdict
from gangcheck.logic.workloads.diagnosis import Target
from tests.builders import node
from tests.unit.test_group_diagnosis import Case, facts_of, group, member, members, req

NOW = datetime(2026, 11, 30, 10, 5, tzinfo=UTC)


def workload_row(**kw: object) -> GangRow:
    fields: dict[str, object] = {
        "namespace": "ns",
        "name": "wl",
        "check": "gangcheck",
        "state": "Pending",
        "phase": "fulfilling",
        "attempt": 1,
        "request": "wl-1",
        "age_seconds": 60,
        "arrived": 2,
        "needed": None,
        "placeable": 0,
        "total": 4,
        "verdict": "blocked: 2 nodes arrived but none tolerates gpu:NoSchedule",
    }
    return GangRow(**{**fields, **kw})  # type: ignore[arg-type]


def table(*rows: GangRow) -> list[list[str]]:
    """The table's lines, split into cells on runs of two or more spaces."""
    text = render_text(StatusReport("ns", rows, NOW))
    return [[c for c in line.split("  ") if c] for line in text.splitlines()]


def cells(rows: list[list[str]], column: str) -> list[str]:
    header = rows[0]
    return [row[header.index(column)].strip() for row in rows[1:]]


def test_the_table_has_a_verdict_column_with_each_gangs_verdict() -> None:
    rows = table(workload_row())
    assert rows[0][-1].strip() == "VERDICT"
    assert cells(rows, "VERDICT") == ["blocked: 2 nodes arrived but none tolerates gpu:NoSchedule"]


def test_nodes_that_arrived_but_none_usable_are_said_not_questioned() -> None:
    rows = table(
        workload_row(), workload_row(name="w2", arrived=0), workload_row(name="w3", needed=3)
    )
    assert cells(rows, "NODES") == ["2 arrived, none usable", "-", "2/3"]
    assert "?" not in "".join(cells(rows, "NODES"))


def test_a_podgroup_row_says_what_is_known_of_its_members() -> None:
    waiting = group_row(
        facts_of(Case("w", group(4, state="WaitingForMembers"), members(2), "", "")), NOW
    )
    released = group_row(
        facts_of(
            Case(
                "r",
                group(4, state="Released"),
                [*members(3, gated=False, node_name="n0"), member(3, gated=False)],
                "",
                "",
            )
        ),
        NOW,
    )
    no_room = group_row(
        facts_of(
            Case(
                "p",
                group(4, state="Provisioning", request="g-pg-1"),
                members(4),
                "",
                "",
                requests=[req(count=4, Accepted="ok")],
            )
        ),
        NOW,
    )
    rows = table(waiting, released, no_room)
    assert cells(rows, "MEMBERS") == ["2/4 exist", "3/4 bound", "0/4"]
    assert cells(rows, "NODES") == ["-", "-", "-"]


def test_diagnose_says_gangcheck_reported_ungated_members_not_that_it_did_nothing() -> None:
    case = Case("u", group(2, ungated_members="m0,m1"), members(2, gated=False), "", "")
    facts = facts_of(case)
    report = GroupReport(Target("podgroup", "default", "g"), facts, group_verdict(facts, NOW), NOW)
    text = render_text(report)
    assert "has not acted" not in text
    assert "gangcheck reported 2 member(s) created without the gangcheck.io/provisioning gate" in (
        text.replace("\n  ", " ")
    )


def test_diagnose_names_members_created_after_the_gang_was_read() -> None:
    case = Case("l", group(2, state="Released", gang_members="2"), [], "", "")
    case.members = [*members(2, gated=False, node_name="n0"), member(2)]
    facts = facts_of(case)
    report = GroupReport(Target("podgroup", "default", "g"), facts, group_verdict(facts, NOW), NOW)
    assert "created after the gang was read, no part of its request: m2" in render_text(report)


def test_a_gang_given_its_capacity_counts_the_nodes_recorded_for_its_request() -> None:
    """Once released (admitted), no fit is computed: NODES says how many nodes arrived for
    the request the gang was given, not '-', and never 'none usable'."""
    arrived_for = "gangcheck.io/arrived-for"
    nodes = [
        node("n0", annotations={arrived_for: "default/g-pg-1"}),
        node("n1", annotations={arrived_for: "default/g-pg-1"}),
        node("n2", annotations={arrived_for: "default/other-1"}),
        node("n3"),
    ]
    released = group_row(
        facts_of(
            Case(
                "r",
                group(2, state="Released", request="g-pg-1"),
                members(2, gated=False, node_name="n0"),
                "",
                "",
                requests=[req(count=2, Provisioned="ok")],
                nodes=nodes,
            )
        ),
        NOW,
    )
    on_existing = group_row(
        facts_of(
            Case(
                "e",
                group(2, state="Released", request="g-pg-1"),
                members(2, gated=False, node_name="n3"),
                "",
                "",
                requests=[req(count=2, Provisioned="ok")],
                nodes=[node("n3")],
            )
        ),
        NOW,
    )
    admitted = workload_row(phase="admitted", needed=None, placeable=None, arrived=3, given=True)
    rows = table(released, on_existing, admitted)
    assert cells(rows, "NODES") == ["2 arrived", "-", "3 arrived"]
