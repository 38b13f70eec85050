"""An attempt whose gang is gone (logic/rollback.abandon): what is reclaimed before its request
is deleted. Pure logic, by table."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from gangcheck.logic.attempt import rollback
from gangcheck.logic.attempt.actions import AnnotateRequest, ReclaimArrivals
from gangcheck.logic.attempt.fulfillment import Capacity
from gangcheck.model.objects import request_of
from tests.builders import T0, node, provisioning_request

REQ = "wl-atomic-1"
ARRIVED = {"gangcheck.io/arrived-for": f"default/{REQ}"}
ELSEWHERE = {"gangcheck.io/arrived-for": "default/other-atomic-1"}


@dataclass(frozen=True)
class Case:
    id: str
    annotations: dict[str, str] = field(default_factory=dict)
    nodes: tuple[dict[str, str], ...] = ()
    records_first: bool = False
    reclaims: tuple[str, ...] | None = None
    """The nodes reclaimed; None: nothing is done before the delete."""


CASES = [
    Case(
        "nodes that arrived mid-attempt are recorded, then reclaimed like any rollback",
        nodes=(ARRIVED, ARRIVED, ELSEWHERE),
        records_first=True,
        reclaims=("n0", "n1"),
    ),
    Case(
        "an attempt already rolling back reclaims what it recorded, without recording again",
        annotations={
            "gangcheck.io/phase": "RollingBack",
            "gangcheck.io/rollback-nodes": '{"gone-already": "2026-11-30T10:00:00Z"}',
        },
        nodes=(ARRIVED,),
        reclaims=("gone-already", "n0"),
    ),
    Case("nothing arrived: nothing to reclaim", nodes=(ELSEWHERE, {})),
    Case(
        "a rollback whose outcome is recorded is not reclaimed twice",
        annotations={"gangcheck.io/phase": "RollingBack", "gangcheck.io/outcome": "{}"},
        nodes=(ARRIVED,),
    ),
    Case(
        "a fulfilled gang's nodes were its own to use: left to the autoscaler",
        annotations={"gangcheck.io/phase": "Fulfilled"},
        nodes=(ARRIVED,),
    ),
    Case(
        "a started gang's nodes are left alone",
        annotations={"gangcheck.io/phase": "Started"},
        nodes=(ARRIVED,),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_abandon(case: Case) -> None:
    req = request_of(provisioning_request(REQ, annotations=case.annotations))
    nodes = tuple(node(f"n{i}", created=T0, annotations=a) for i, a in enumerate(case.nodes))
    actions = rollback.abandon(req, Capacity(nodes=nodes), "cordon", "Workload deleted")
    if case.reclaims is None:
        assert actions == ()
        return
    *first, last = actions
    assert isinstance(last, ReclaimArrivals)
    assert last.nodes == case.reclaims
    assert (last.request, last.request_key, last.reclaimer) == (REQ, f"default/{REQ}", "cordon")
    if case.records_first:
        (annotate,) = first
        assert isinstance(annotate, AnnotateRequest)
        assert annotate.annotations["gangcheck.io/phase"] == "RollingBack"
        assert annotate.annotations["gangcheck.io/rollback-reason"] == "Workload deleted"
        assert set(json.loads(annotate.annotations["gangcheck.io/rollback-nodes"])) == set(
            case.reclaims
        )
    else:
        assert first == []
