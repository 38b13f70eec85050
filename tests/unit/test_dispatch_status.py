"""`gangcheck status` on a MultiKueue manager: its gangs per worker cluster, from each
Workload's ``status.clusterName``, ``status.nominatedClusterNames``, MultiKueue's check and the
dispatcher's record (annotation ``gangcheck.io/dispatch``). Pure: ``dispatch.worker_rows`` and
the rendering; the command's I/O on real clusters is in tests/e2e/multicluster."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from gangcheck.diagnose import StatusReport, render_text
from gangcheck.diagnose.as_json import to_json
from gangcheck.logic.dispatch import RECORD_ANNOTATION, WorkerRow, worker_rows

NOW = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)
CHECK = "multikueue"


def wl(
    name: str,
    *,
    cluster: str | None = None,
    nominated: tuple[str, ...] = (),
    record: dict[str, Any] | None = None,
    state: str = "Pending",
    message: str = "",
    checks: tuple[str, ...] = (CHECK,),
    finished: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "team",
        "creationTimestamp": "2026-12-05T09:58:00Z",
    }
    if record is not None:
        meta["annotations"] = {RECORD_ANNOTATION: json.dumps(record)}
    status: dict[str, Any] = {
        "admissionChecks": [{"name": c, "state": state, "message": message} for c in checks],
        "conditions": [{"type": "Finished", "status": "True"}] if finished else [],
    }
    if cluster:
        status["clusterName"] = cluster
    if nominated:
        status["nominatedClusterNames"] = list(nominated)
    return {"metadata": meta, "status": status}


def brief(rows: list[WorkerRow]) -> list[tuple[str, str, str]]:
    return [(r.worker, r.name, r.placement) for r in rows]


@pytest.mark.parametrize(
    ("workloads", "expected"),
    [
        pytest.param(
            [wl("a", cluster="worker-2", state="Ready")],
            [("worker-2", "a", "placed")],
            id="placed: under its cluster only",
        ),
        pytest.param(
            [wl("a", nominated=("worker-1", "worker-2"))],
            [("worker-1", "a", "nominated"), ("worker-2", "a", "nominated")],
            id="AllAtOnce: under every worker nominated",
        ),
        pytest.param(
            [
                wl(
                    "a",
                    nominated=("worker-2",),
                    record={
                        "nominated": ["worker-2"],
                        "tried": ["worker-1", "worker-2"],
                        "failed": {"worker-1": "check gc Retry: stockout"},
                        "reason": "worker-1 failed; worker-2 has no record",
                    },
                )
            ],
            [("worker-1", "a", "given up"), ("worker-2", "a", "nominated")],
            id="the dispatcher moved on: given up and nominated",
        ),
        pytest.param(
            [wl("a", record={"nominated": ["worker-1"], "tried": ["worker-1"], "reason": "r"})],
            [("worker-1", "a", "recorded")],
            id="recorded, nomination not written yet",
        ),
        pytest.param(
            [
                wl(
                    "a",
                    record={
                        "tried": ["worker-1"],
                        "failed": {"worker-1": "evicted"},
                        "reason": "no worker left to try (tried and failed: worker-1)",
                    },
                )
            ],
            [("worker-1", "a", "given up"), ("", "a", "waiting")],
            id="nowhere left: given up, and waiting under none",
        ),
        pytest.param(
            [wl("a"), wl("b", cluster="worker-1", state="Ready")],
            [("worker-1", "b", "placed"), ("", "a", "waiting")],
            id="workers first, by name; gangs with no worker last",
        ),
        pytest.param(
            [wl("a", checks=("gangcheck",)), wl("b", cluster="worker-1", finished=True)],
            [],
            id="not MultiKueue's, or finished: not listed",
        ),
    ],
)
def test_gangs_are_listed_per_worker(
    workloads: list[dict[str, Any]], expected: list[tuple[str, str, str]]
) -> None:
    assert brief(worker_rows(workloads, [CHECK], NOW)) == expected


def test_a_row_says_the_check_its_age_and_why() -> None:
    record = {
        "nominated": ["worker-2"],
        "tried": ["worker-1", "worker-2"],
        "failed": {"worker-1": "check gc Retry: stockout"},
        "reason": "given up: worker-1; worker-2 has no record of its capacity sources",
    }
    rows = worker_rows([wl("a", nominated=("worker-2",), record=record)], [CHECK], NOW)
    given_up, nominated = rows
    assert given_up.detail == "check gc Retry: stockout"
    assert nominated.detail == record["reason"]
    assert (nominated.check, nominated.state, nominated.age_seconds) == (CHECK, "Pending", 120)
    placed = worker_rows([wl("b", cluster="worker-1", message="reserved")], [CHECK], NOW)
    assert placed[0].detail == "reserved"  # MultiKueue's check message


def test_status_prints_the_workers_table_on_a_manager_with_no_gang_of_its_own() -> None:
    rows = worker_rows(
        [wl("a", cluster="worker-2", state="Ready"), wl("b", nominated=("worker-1",))],
        [CHECK],
        NOW,
    )
    text = render_text(StatusReport(None, (), NOW, tuple(rows)))
    assert "No gangs in flight" not in text
    lines = text.splitlines()
    assert lines[0] == "Across worker clusters (MultiKueue):"
    assert lines[1].split() == [
        "WORKER", "NAMESPACE/NAME", "PLACEMENT", "CHECK", "STATE", "AGE", "DETAIL"
    ]  # fmt: skip
    assert lines[2].split()[:3] == ["worker-1", "team/b", "nominated"]
    assert lines[3].split()[:3] == ["worker-2", "team/a", "placed"]
    listed = to_json(StatusReport(None, (), NOW, tuple(rows)))
    assert [(w["worker"], w["name"], w["placement"]) for w in listed["workers"]] == [
        ("worker-1", "b", "nominated"),
        ("worker-2", "a", "placed"),
    ]
    assert render_text(StatusReport(None, (), NOW)) == "No gangs in flight.\n"
