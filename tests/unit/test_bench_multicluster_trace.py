"""The multi-cluster benchmark's ``--trace`` milestones
(``benchmarks/multicluster_side_by_side.py``): per gang, when each was first seen, from the
Job's creation, in the manager and in the worker the gang ran in (not in the worker its copy
lost in), and the table line of it."""

from __future__ import annotations

from typing import Any

from gangcheck_dev.simcloud.model import REQUEST_ANNOTATION

from benchmarks import multicluster_side_by_side as bench
from gangcheck.kube.resources import NODE, POD, PROVISIONING_REQUEST, WORKLOAD

Obj = dict[str, Any]
NS = "room-d-1"
W1, W2 = bench.WORKERS


def workload(*, nominated: bool = False, placed: str = "", ready: bool = False) -> Obj:
    status: Obj = {"conditions": [], "admissionChecks": []}
    if nominated:
        status["nominatedClusterNames"] = [W1]
    if placed:
        status["clusterName"] = placed
    if ready:
        status["admissionChecks"] = [{"name": "c", "state": "Ready", "message": ""}]
        status["conditions"] = [{"type": "Admitted", "status": "True"}]
    return {"metadata": {"name": "job-g1-abcde", "namespace": NS}, "status": status}


def request(*, provisioned: bool = False) -> Obj:
    conditions = [{"type": "Provisioned", "status": "True", "reason": "Provisioned"}]
    return {
        "metadata": {"name": "job-g1-abcde-c-1", "namespace": NS},
        "status": {"conditions": conditions if provisioned else []},
    }


def node(name: str) -> Obj:
    notes = {REQUEST_ANNOTATION: f"{NS}/job-g1-abcde-c-1"}
    return {"metadata": {"name": name, "annotations": notes}, "status": {}}


def pod(name: str, phase: str) -> Obj:
    labels = {bench.JOB_NAME_LABEL: "g1"}
    meta = {"name": name, "namespace": NS, "labels": labels}
    return {"metadata": meta, "status": {"phase": phase}}


def test_each_milestone_is_when_first_seen_in_the_worker_the_gang_ran_in() -> None:
    gang = bench.Gang("g1")
    tracer = bench.Tracer({}, NS, "room", [gang])
    gang.created = tracer.t0 + 0.1  # the Job made 0.1 s after the tracer began
    events: list[tuple[float, str, Any, Obj]] = [
        (0.3, bench.MANAGER, WORKLOAD, workload(nominated=True)),
        (0.4, W1, PROVISIONING_REQUEST, request()),
        (0.5, W2, PROVISIONING_REQUEST, request()),
        (0.9, W1, PROVISIONING_REQUEST, request(provisioned=True)),
        (1.0, W2, PROVISIONING_REQUEST, request(provisioned=True)),
        (1.2, W2, NODE, node("n1")),  # the loser's nodes, first
        (1.3, W2, NODE, node("n2")),
        (1.4, W2, WORKLOAD, workload(ready=True)),
        (1.4, W1, NODE, node("n3")),
        (1.5, W1, NODE, node("n3")),  # the same node again: one of the MEMBERS
        (1.6, W1, NODE, node("n4")),
        (1.7, W1, WORKLOAD, workload(ready=True)),
        (2.7, bench.MANAGER, WORKLOAD, workload(nominated=True, placed=W1)),
        (2.8, W1, POD, pod("p1", "Running")),
        (2.9, W1, POD, pod("p2", "Pending")),
        (3.0, W1, POD, pod("p2", "Running")),
        (3.5, bench.MANAGER, WORKLOAD, workload(placed=W1)),  # later sightings: not moved
        (3.6, W1, POD, pod("p1", "Running")),
    ]
    for at, cluster, res, obj in events:
        tracer._note(cluster, res, "MODIFIED", obj, at=at)

    m = tracer.milestones(gang)
    assert m == {
        "worker": W1,
        "nominated": 0.2,
        "request": 0.3,
        "provisioned": 0.8,
        "nodes": 1.5,
        "ready": 1.6,
        "admitted": 1.6,
        "placed": 2.6,
        "running": 2.9,
    }

    figures = {**gang.figures(), "milestones": m}
    result = {"results": {"room": {"d": [figures]}}}
    lines = bench.milestone_lines(result)
    assert lines[1].startswith("where the time went (--trace)")
    assert lines[3].startswith("room: (d) gangcheck's dispatcher + gangcheck")
    # the milestones in order, then placed 1.0 s after the copy was admitted
    cells = ["0.20", "0.30", "0.80", "1.50", "1.60", "1.60", "2.60", "2.90", "1.00"]
    assert lines[3].split()[-11:] == ["g1", W1, *cells]


def test_a_gang_that_did_not_start_has_no_worker_and_the_table_says_dash() -> None:
    gang = bench.Gang("g1")
    tracer = bench.Tracer({}, NS, "half", [gang])
    gang.created = tracer.t0
    tracer._note(bench.MANAGER, WORKLOAD, "ADDED", workload(nominated=True), at=0.2)

    m = tracer.milestones(gang)
    assert m["worker"] is None and m["nominated"] == 0.2
    assert all(m[key] is None for key, _ in bench.MILESTONES if key != "nominated")
    figures = {**gang.figures(), "milestones": m}
    row = bench.milestone_lines({"results": {"half": {"a": [figures]}}})[3].split()
    assert row[-10:] == ["-", "0.20", "-", "-", "-", "-", "-", "-", "-", "-"]


def test_no_milestones_without_trace() -> None:
    gang = bench.Gang("g1")
    assert bench.milestone_lines({"results": {"room": {"a": [gang.figures()]}}}) == []


def _ran(name: str, start: float | None, *, clusters: int = 1, elsewhere: float = 0.0) -> Obj:
    gang = bench.Gang(name)
    figures = {**gang.figures(), "time_to_start_s": start}
    figures["clusters_scaled_up"] = list(bench.WORKERS[:clusters])
    figures["stranded_node_min_elsewhere"] = elsewhere
    if start is not None:
        figures["milestones"] = {"running": start - 0.25}
    return figures


def test_over_several_runs_each_configuration_gives_the_median_and_worst_of_every_gang() -> None:
    runs = [
        [_ran("g1", 9.0, clusters=2, elsewhere=4.0), _ran("g2", None, clusters=0)],  # cold
        [_ran("g1", 1.5), _ran("g2", 2.0, clusters=2, elsewhere=0.5)],
        [_ran("g1", 3.0), _ran("g2", None, clusters=0)],
        [_ran("g1", 1.0), _ran("g2", 2.5)],
    ]
    result = {"runs": 4, "every_run": {"stockout": {"d": runs}}}

    lines = bench.runs_lines(result)

    assert "runs 2-4, the first (cold) left out" in lines[1]
    row = lines[-1]
    assert row.startswith("stockout: (d) gangcheck's dispatcher + gangcheck")
    # the cold run left out; 5 of 6 started: sampled 1.0 1.5 2.0 2.5 3.0, watched 0.25 s
    # sooner; 6 clusters / 6 gangs
    cells = ["5/6", "2.00", "/", "3.00", "1.75", "/", "2.75", "1.00", "0.50"]
    assert row.split()[-9:] == cells


def test_one_run_has_no_summary_of_runs_and_two_count_both() -> None:
    result = {"runs": 1, "every_run": {"stockout": {"d": [[_ran("g1", 1.5)]]}}}
    assert bench.runs_lines(result) == []
    two = {"runs": 2, "every_run": {"stockout": {"d": [[_ran("g1", 3.0)], [_ran("g1", 1.0)]]}}}
    assert bench.runs_lines(two)[-1].split()[-9:-6] == ["2/2", "2.00", "/"]


def test_learned_has_worker_1_stocked_out_and_room_in_worker_2_for_both_waves() -> None:
    gangs = 4
    whole = gangs * bench.MEMBERS
    assert bench.room("learned", W1, gangs) == 0
    assert bench.room("learned", W2, gangs) == 2 * whole
    assert bench.room("stockout", W2, gangs) == whole  # one wave there
    groups = {g["name"]: g for g in bench.sim_config(W2, gangs)["nodeGroups"]}
    assert groups["bench-learned"]["maxNodes"] == 2 * whole
    assert set(bench.TITLES) == set(bench.SCENARIOS)


def test_the_first_wave_is_never_counted_as_a_measured_gang() -> None:
    measured = [bench.Gang("g1"), bench.Gang("g2")]
    assert bench.gang_of(measured, "job-w1-abcde-check-1") is None
    assert bench.gang_of(measured, "job-g2-abcde-check-1") is measured[1]
