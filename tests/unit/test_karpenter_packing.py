"""Members packed onto as few NodeClaims as a NodePool's declared instance types allow (pure)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from gangcheck.logic.placement.fit import GangPodSet, fit_gang, member_from_pod_spec, node_view
from gangcheck.logic.placement.quantity import parse_quantity
from gangcheck.logic.sources.karpenter import names
from gangcheck.logic.sources.karpenter.claims import ClaimAsk, claim_bodies, claims_made
from gangcheck.logic.sources.karpenter.packing import Member, pack
from gangcheck.logic.sources.karpenter.provisioner import serve
from gangcheck.model.provisioning_config import KARPENTER_CLASS
from tests.unit.test_karpenter_logic import GPU, pool

Obj = dict[str, Any]
KEY = "team-a/train-pack-1"
NOW = datetime(2026, 12, 1, 10, 0, 5, tzinfo=UTC)
INSTANCE = names.INSTANCE_TYPE_LABEL
GPU_8X = {GPU: "8", "cpu": "32", "memory": "256Gi", "pods": "110"}
GPU_1X = {GPU: "1", "cpu": "8", "memory": "64Gi"}


def declaring(types: dict[str, dict[str, str]] | str, **kwargs: Any) -> Obj:
    """A pool (of ``test_karpenter_logic``) declaring ``types`` in its annotation."""
    made = pool(**kwargs)
    raw = types if isinstance(types, str) else json.dumps(types)
    made["metadata"]["annotations"][names.INSTANCE_TYPES] = raw
    return made


def admitting(*types: str) -> list[Obj]:
    return [{"key": INSTANCE, "operator": "In", "values": list(types)}]


def members(*sizes: dict[str, str]) -> list[Member]:
    return [
        Member(f"m{i}", {r: parse_quantity(q) for r, q in size.items()})
        for i, size in enumerate(sizes)
    ]


def gpus(n: int, cpu: str = "1") -> dict[str, str]:
    return {GPU: str(n), "cpu": cpu}


@dataclass(frozen=True)
class Case:
    gang: list[Member]
    pool: Obj
    #: Per claim: its members and the instance types it names.
    claims: list[tuple[list[str], list[str]]] = field(default_factory=list)
    #: Per claim: its requests.
    requests: list[dict[str, str]] | None = None
    problem: str = ""
    labels: dict[str, str] = field(default_factory=dict)


EIGHT_ONES = members(*[gpus(1)] * 8)
CASES = {
    "eight 1-GPU members share one 8-GPU machine": Case(
        EIGHT_ONES,
        declaring({"gpu-8x": GPU_8X}),
        [([f"m{i}" for i in range(8)], ["gpu-8x"])],
        requests=[{GPU: "8", "cpu": "8"}],
    ),
    "twelve make a full claim and one of four": Case(
        members(*[gpus(1)] * 12),
        declaring({"gpu-8x": GPU_8X}),
        [([f"m{i}" for i in range(8)], ["gpu-8x"]), ([f"m{i}" for i in range(8, 12)], ["gpu-8x"])],
        requests=[{GPU: "8", "cpu": "8"}, {GPU: "4", "cpu": "4"}],
    ),
    "first-fit decreasing: the large ones first, the small fill in": Case(
        members(gpus(1), gpus(2), gpus(4), gpus(1), gpus(2), gpus(4), gpus(1), gpus(1)),
        declaring({"gpu-8x": GPU_8X}),
        [(["m2", "m5"], ["gpu-8x"]), (["m1", "m4", "m0", "m3", "m6", "m7"], ["gpu-8x"])],
    ),
    "node-sized members keep a claim each": Case(
        members(*[gpus(8)] * 3),
        declaring({"gpu-8x": GPU_8X}),
        [(["m0"], ["gpu-8x"]), (["m1"], ["gpu-8x"]), (["m2"], ["gpu-8x"])],
    ),
    "the CPU of the machine bounds the members per claim": Case(
        members(*[gpus(1, cpu="10")] * 8),
        declaring({"gpu-8x": GPU_8X}),
        [
            (["m0", "m1", "m2"], ["gpu-8x"]),
            (["m3", "m4", "m5"], ["gpu-8x"]),
            (["m6", "m7"], ["gpu-8x"]),
        ],
    ),
    "pods, when declared, bound the members per claim": Case(
        EIGHT_ONES,
        declaring({"gpu-8x": {**GPU_8X, "pods": "4"}}),
        [(["m0", "m1", "m2", "m3"], ["gpu-8x"]), (["m4", "m5", "m6", "m7"], ["gpu-8x"])],
    ),
    "a claim names only the types that hold its sum": Case(
        members(gpus(1), gpus(1), gpus(1)),
        declaring({"gpu-1x": GPU_1X, "gpu-8x": GPU_8X}, requirements=admitting("gpu-1x", "gpu-8x")),
        [(["m0", "m1", "m2"], ["gpu-8x"])],
    ),
    "a lone small member may go on either type": Case(
        members(gpus(1)),
        declaring({"gpu-1x": GPU_1X, "gpu-8x": GPU_8X}, requirements=admitting("gpu-1x", "gpu-8x")),
        [(["m0"], ["gpu-1x", "gpu-8x"])],
    ),
    "the pool's requirements leave only the small machine": Case(
        members(gpus(1), gpus(1)),
        declaring({"gpu-1x": GPU_1X, "gpu-8x": GPU_8X}, requirements=admitting("gpu-1x")),
        [(["m0"], ["gpu-1x"]), (["m1"], ["gpu-1x"])],
    ),
    "NotIn takes a type out": Case(
        members(gpus(1), gpus(1)),
        declaring(
            {"gpu-1x": GPU_1X, "gpu-8x": GPU_8X},
            requirements=[{"key": INSTANCE, "operator": "NotIn", "values": ["gpu-8x"]}],
        ),
        [(["m0"], ["gpu-1x"]), (["m1"], ["gpu-1x"])],
    ),
    "the flavor's instance-type label narrows as the requirements do": Case(
        members(gpus(1), gpus(1)),
        declaring({"gpu-1x": GPU_1X, "gpu-8x": GPU_8X}, requirements=admitting("gpu-1x", "gpu-8x")),
        [(["m0"], ["gpu-1x"]), (["m1"], ["gpu-1x"])],
        labels={INSTANCE: "gpu-1x"},
    ),
    "a resource a type does not list, it has none of": Case(
        members(gpus(1), gpus(1)),
        declaring({"cpu-4x": {"cpu": "4", "memory": "16Gi"}}, requirements=admitting("cpu-4x")),
        problem=(
            "NodePool 'gpu': no instance type it may launch can take m0 (cpu=1, nvidia.com/gpu=1);"
            " it may launch cpu-4x: cpu=4, memory=16Gi"
        ),
    ),
    "a member bigger than every machine names the pool and the member": Case(
        members(gpus(1), gpus(16)),
        declaring({"gpu-8x": GPU_8X}),
        problem=(
            "NodePool 'gpu': no instance type it may launch can take m1 (cpu=1, nvidia.com/gpu=16)"
        ),
    ),
    "declared types none of which the pool admits": Case(
        EIGHT_ONES,
        declaring({"gpu-1x": GPU_1X}),
        problem="none of the instance types its annotation gangcheck.io/instance-types declares "
        "(gpu-1x) is admitted",
    ),
    "nothing declared: a claim per member, its own requests, the pool's requirements": Case(
        members(gpus(1), gpus(2, cpu="3")),
        pool(),
        [(["m0"], []), (["m1"], [])],
        requests=[{GPU: "1", "cpu": "1"}, {GPU: "2", "cpu": "3"}],
    ),
    "a declaration that is not JSON": Case(
        EIGHT_ONES,
        declaring("{gpu-8x"),
        problem="NodePool 'gpu' annotation gangcheck.io/instance-types is not JSON",
    ),
    "a declaration with a bad quantity": Case(
        EIGHT_ONES,
        declaring({"gpu-8x": {GPU: "eight"}}),
        problem="NodePool 'gpu' annotation gangcheck.io/instance-types: 'gpu-8x':",
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_packing(case: Case) -> None:
    packing = pack(case.gang, case.pool, case.labels)
    if case.problem:
        assert case.problem in packing.problem
        assert packing.claims == ()
        return
    assert packing.problem == ""
    got = [(list(c.members), list(c.instance_types)) for c in packing.claims]
    assert got == case.claims
    if case.requests is not None:
        assert [c.asked() for c in packing.claims] == case.requests
    # every member is on exactly one claim, and each claim asks for its members' sum
    placed = [m for c in packing.claims for m in c.members]
    assert sorted(placed) == sorted(m.name for m in case.gang)
    by_name = {m.name: m for m in case.gang}
    for claim in packing.claims:
        total: dict[str, int] = {}
        for name in claim.members:
            for resource, amount in by_name[name].requests.items():
                total[resource] = total.get(resource, 0) + amount
        assert dict(claim.requests) == total


def test_a_packed_claim_names_the_types_that_hold_it_first_and_asks_the_sum() -> None:
    gpu_pool = declaring(
        {"gpu-1x": GPU_1X, "gpu-8x": GPU_8X}, requirements=admitting("gpu-1x", "gpu-8x")
    )
    packing = pack(EIGHT_ONES, gpu_pool, {})
    (body,) = claim_bodies(gpu_pool, ClaimAsk.packing(KEY, packing.claims, {"team": "ml"}))
    requirements = body["spec"]["requirements"]
    assert requirements[0] == {"key": INSTANCE, "operator": "In", "values": ["gpu-8x"]}
    assert [r for r in requirements if r["key"] == INSTANCE] == [requirements[0]]
    assert {"key": "team", "operator": "In", "values": ["ml"]} in requirements
    assert body["spec"]["resources"]["requests"] == {GPU: "8", "cpu": "8"}
    annotations = body["metadata"]["annotations"]
    assert (annotations[names.GANG_NODES], annotations[names.CLAIM_MEMBERS]) == ("1", "8")


def test_several_members_fit_the_node_a_packed_claim_becomes() -> None:
    """The arrival checks place members on the real node: the kwok provider's node of a
    packed claim (allocatable: the claim's requests, overlaid with the machine's) takes all
    eight, and a ninth does not fit."""
    gpu_pool = declaring({"gpu-8x": GPU_8X})
    (claim,) = pack(EIGHT_ONES, gpu_pool, {}).claims
    node = {
        "metadata": {"name": "kwok-node", "labels": {INSTANCE: "gpu-8x"}},
        "spec": {"taints": []},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "allocatable": {**claim.asked(), **GPU_8X},
        },
    }
    member = member_from_pod_spec(
        {"containers": [{"resources": {"requests": gpus(1), "limits": {GPU: "1"}}}]}
    )
    assert fit_gang([GangPodSet("worker", 8, member)], [node_view(node)]).fits
    assert not fit_gang([GangPodSet("worker", 9, member)], [node_view(node)]).fits


# -- serving a request with a declaring pool ------------------------------------------------


def request(count: int, *conditions: tuple[str, str, str]) -> Obj:
    return {
        "metadata": {
            "name": "train-pack-1",
            "namespace": "team-a",
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "resourceVersion": "7",
        },
        "spec": {
            "provisioningClassName": KARPENTER_CLASS,
            "parameters": {"nodePools": "gpu"},
            "podSets": [{"podTemplateRef": {"name": "ppt-worker"}, "count": count}],
        },
        "status": {
            "conditions": [
                {"type": t, "status": s, "reason": "R", "message": m} for t, s, m in conditions
            ]
        },
    }


def templates(size: dict[str, str]) -> dict[str, Obj]:
    spec = {"containers": [{"resources": {"requests": size}}], "nodeSelector": {"team": "ml"}}
    return {"ppt-worker": {"template": {"spec": spec}}}


def serving(req: Obj, gpu_pool: Obj, size: dict[str, str], made: list[Obj] | None = None) -> Any:
    return serve(
        req,
        KEY,
        templates=templates(size),
        claims=made or [],
        pools={"gpu": gpu_pool},
        nodes={},
        now=NOW,
    )


def test_a_gang_of_small_members_gets_one_claim_and_says_so() -> None:
    done = serving(request(8), declaring({"gpu-8x": GPU_8X}), gpus(1))
    (body,) = done.create
    assert body["spec"]["resources"]["requests"] == {GPU: "8", "cpu": "8"}
    (accepted,) = done.conditions
    assert accepted["message"] == "created 1 NodeClaims for 8 members in NodePool 'gpu'"
    assert claims_made(accepted["message"]) == 1


def test_a_member_no_machine_takes_fails_at_once_naming_the_pool_and_the_member() -> None:
    done = serving(request(2), declaring({"gpu-8x": GPU_8X}), gpus(16))
    assert done.create == ()
    (failed,) = done.conditions
    assert (failed["type"], failed["status"], failed["reason"]) == (
        "Failed",
        "True",
        "NoInstanceTypeFits",
    )
    assert failed["message"].startswith(
        "spec.karpenter.nodePools[0]: NodePool 'gpu': no instance type it may launch can take "
        "member 0 of PodTemplate 'ppt-worker' (cpu=1, nvidia.com/gpu=16)"
    )


def test_the_limits_are_charged_with_the_packed_claims() -> None:
    """Nine 1-GPU members make a claim of 8 and one of 1: 9 GPUs, one more than the limit."""
    limited = declaring({"gpu-8x": GPU_8X}, limits={GPU: "8"})
    (failed,) = serving(request(9), limited, gpus(1)).conditions
    assert (failed["type"], failed["reason"]) == ("Failed", "NodePoolLimits")
    assert "leave room for 1 of 2 nodes" in failed["message"]
    assert len(serving(request(8), limited, gpus(1)).create) == 1


def test_a_packed_attempt_whose_only_claim_is_gone_failed() -> None:
    accepted = ("Accepted", "True", "created 1 NodeClaims for 8 members in NodePool 'gpu'")
    (failed,) = serving(request(8, accepted), declaring({"gpu-8x": GPU_8X}), gpus(1)).conditions
    assert (failed["type"], failed["reason"]) == ("Failed", "NodeClaimLost")
    assert failed["message"].startswith(
        "0 of 1 NodeClaims arrived; 1 lost (gone before the gang started"
    )


def test_a_packed_attempt_is_provisioned_once_its_one_claim_launched() -> None:
    gpu_pool = declaring({"gpu-8x": GPU_8X})
    (body,) = serving(request(8), gpu_pool, gpus(1)).create
    body["status"] = {"conditions": [{"type": "Launched", "status": "True"}]}
    accepted = ("Accepted", "True", "created 1 NodeClaims for 8 members in NodePool 'gpu'")
    (provisioned,) = serving(request(8, accepted), gpu_pool, gpus(1), [body]).conditions
    assert (provisioned["type"], provisioned["status"]) == ("Provisioned", "True")
    assert provisioned["message"] == "0 of 1 NodeClaims arrived"
