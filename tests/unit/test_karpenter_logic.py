"""The Karpenter backend's pure parts: the gang's NodeClaims, what they say, which pool."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gangcheck.logic.attempt.hold import HOLD_TAINT, hold_value
from gangcheck.logic.sources.karpenter import names
from gangcheck.logic.sources.karpenter.claims import (
    AttemptPhase,
    ClaimAsk,
    ClaimPhase,
    attempt_claims,
    claim_bodies,
    claim_state,
    claims_status,
    release_protection_patch,
)
from gangcheck.logic.sources.karpenter.pools import choose_pool, label_problem, pool_use, room
from gangcheck.model.provisioning_config import Backend, parse_spec
from tests.builders import node_pool

Obj = dict[str, Any]
ATTEMPT = "team-a/train-gangcheck-1"
GPU = "nvidia.com/gpu"
INSTANCE_TYPE = {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["gpu-8x"]}


def pool(
    name: str = "gpu",
    *,
    limits: dict[str, str] | None = None,
    used: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    requirements: list[Obj] | None = None,
    typed: bool = False,
) -> Obj:
    """The unit tests' NodePool: the kwok one of tests/builders with what a pool's choice and
    its claims read: nodes of the team's label, one instance type, GPU-tainted, never
    expiring, Karpenter's template hash; `limits` when given, `used` (none by default)."""
    return node_pool(
        name,
        uid="u-1",
        requirements=requirements or [INSTANCE_TYPE],
        labels=labels or {"team": "ml"},
        taints=[{"key": GPU, "value": "present", "effect": "NoSchedule"}],
        expire_after="Never",
        limits=limits or None,
        used=used or {},
        annotations={names.POOL_HASH: "123", names.POOL_HASH_VERSION: "v3"},
        typed=typed,
    )


ASK = ClaimAsk(ATTEMPT, 4, {GPU: "8", "cpu": "30"}, {"gangcheck.io/gpu-type": "h100"})


def claim(index: int, *conditions: str, node: str = "", deleting: bool = False) -> Obj:
    body = claim_bodies(pool(), ASK)[index]
    body["status"] = {
        "conditions": [{"type": c, "status": "True"} for c in conditions],
        "nodeName": node,
    }
    if deleting:
        body["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return body


def test_claims_are_the_pools_template_held_labelled_and_protected() -> None:
    bodies = claim_bodies(pool(), ASK)
    assert len(bodies) == 4
    assert len({b["metadata"]["name"] for b in bodies}) == 4
    first = bodies[0]
    meta, spec = first["metadata"], first["spec"]
    assert meta["labels"][names.NODE_POOL_LABEL] == "gpu"
    assert meta["labels"][names.ATTEMPT_LABEL] == hold_value(ATTEMPT)
    assert meta["labels"]["karpenter.kwok.sh/kwoknodeclass"] == "default"
    assert meta["labels"]["team"] == "ml"
    assert meta["labels"]["gangcheck.io/gpu-type"] == "h100"
    assert meta["annotations"][names.DO_NOT_DISRUPT] == "true"
    assert meta["annotations"][names.POOL_HASH] == "123"
    assert meta["annotations"][names.GANG_NODES] == "4"
    assert meta["ownerReferences"][0]["uid"] == "u-1"
    assert spec["resources"] == {"requests": {GPU: "8", "cpu": "30"}}
    assert spec["nodeClassRef"]["kind"] == "KWOKNodeClass"
    assert spec["expireAfter"] == "Never"
    assert {"key": "gangcheck.io/gpu-type", "operator": "In", "values": ["h100"]} in spec[
        "requirements"
    ]
    assert [t["key"] for t in spec["taints"]] == [GPU, HOLD_TAINT]


def test_claim_names_are_the_same_on_a_retry_and_differ_per_attempt() -> None:
    again = [b["metadata"]["name"] for b in claim_bodies(pool(), ASK)]
    assert again == [b["metadata"]["name"] for b in claim_bodies(pool(), ASK)]
    other = ClaimAsk("team-a/train-gangcheck-2", 4, ASK.requests)
    assert not set(again) & {b["metadata"]["name"] for b in claim_bodies(pool(), other)}


@pytest.mark.parametrize(
    ("conditions", "node", "phase"),
    [
        ((), "", ClaimPhase.REQUESTED),
        (("Launched",), "", ClaimPhase.LAUNCHED),
        (("Launched", "Registered"), "n1", ClaimPhase.REGISTERED),
        (("Launched", "Registered", "Initialized"), "n1", ClaimPhase.ARRIVED),
    ],
    ids=["a new claim is requested", "launched", "registered", "initialized with a node arrived"],
)
def test_claim_phase_follows_its_conditions(
    conditions: tuple[str, ...], node: str, phase: ClaimPhase
) -> None:
    assert claim_state(claim(0, *conditions, node=node)).phase is phase


def test_a_launch_failure_reason_is_reported() -> None:
    failing = claim(0)
    failing["status"]["conditions"] = [
        {"type": "Launched", "status": "Unknown", "reason": "LaunchFailed", "message": "quota"}
    ]
    state = claim_state(failing)
    assert state.phase is ClaimPhase.LAUNCH_FAILING
    assert state.message == "LaunchFailed: quota"


def test_every_claim_launched_is_provisioned_before_any_arrived() -> None:
    status = claims_status([claim(i, "Launched") for i in range(4)], ATTEMPT, 4)
    assert status.phase is AttemptPhase.PROVISIONED
    assert status.arrived == ()
    assert claims_status(
        [claim(i, "Launched") for i in range(3)] + [claim(3)], ATTEMPT, 4
    ).phase is (AttemptPhase.PENDING)


def test_every_claim_arrived_is_provisioned() -> None:
    done = ("Launched", "Registered", "Initialized")
    status = claims_status([claim(i, *done, node=f"n{i}") for i in range(4)], ATTEMPT, 4)
    assert status.phase is AttemptPhase.PROVISIONED
    assert status.arrived == ("n0", "n1", "n2", "n3")


def test_a_claim_gone_before_it_arrived_is_a_partial_delivery() -> None:
    done = ("Launched", "Registered", "Initialized")
    claims = [claim(i, *done, node=f"n{i}") for i in range(3)]  # index 3 was deleted
    status = claims_status(claims, ATTEMPT, 4)
    assert status.phase is AttemptPhase.FAILED
    assert status.lost == (3,)
    assert "3 of 4 NodeClaims arrived; 1 lost" in status.message


def test_a_claim_being_deleted_before_it_arrived_is_lost() -> None:
    claims = [claim(0, deleting=True), *(claim(i) for i in range(1, 4))]
    assert claims_status(claims, ATTEMPT, 4).lost == (0,)


def test_claims_of_other_attempts_or_nobody_are_not_counted_nor_withdrawn() -> None:
    foreign = claim(0)
    foreign["metadata"]["labels"][names.ATTEMPT_LABEL] = hold_value("other/attempt")
    karpenters = {"metadata": {"name": "gpu-abcde", "labels": {names.NODE_POOL_LABEL: "gpu"}}}
    mine = [claim(i) for i in range(4)]
    status = claims_status([foreign, karpenters, *mine], ATTEMPT, 4)
    assert len(status.claims) == 4
    assert attempt_claims([foreign, karpenters, *mine], ATTEMPT) == mine


def test_protection_is_removed_only_where_gangcheck_value_is() -> None:
    node = {"metadata": {"annotations": {names.DO_NOT_DISRUPT: "true"}}}
    patch = release_protection_patch(node)
    assert patch[0] == {
        "op": "test",
        "path": "/metadata/annotations/karpenter.sh~1do-not-disrupt",
        "value": "true",
    }
    assert patch[1]["op"] == "remove"
    assert release_protection_patch({"metadata": {}}) == []


@pytest.mark.parametrize(
    ("limits", "used", "expected"),
    [
        ({}, {}, None),
        ({GPU: "24"}, {}, 3),
        ({GPU: "32"}, {GPU: "8"}, 3),
        ({"nodes": "3"}, {"nodes": "1"}, 2),
        ({"memory": "1Ti"}, {}, None),
        ({GPU: "64", "nodes": "2"}, {}, 2),
    ],
    ids=[
        "no limits: no limit applies",
        "24 GPUs take three 8-GPU nodes",
        "room is the limit minus what the pool holds",
        "a nodes limit counts claims",
        "a resource the claim does not request is not estimated",
        "the tightest limit wins",
    ],
)
def test_room_left_by_limits(
    limits: dict[str, str], used: dict[str, str], expected: int | None
) -> None:
    assert room(pool(limits=limits, used=used), {GPU: "8", "cpu": "30"}) == expected


def pool_claim(
    name: str,
    *,
    pool_name: str = "gpu",
    gpus: str = "8",
    capacity: str | None = None,
    launched: bool = False,
    deleting: bool = False,
    terminating: bool = False,
) -> Obj:
    """A NodeClaim of ``pool_name`` asking for ``gpus``; launched: it has a provider id and
    the instance's ``capacity`` (as Karpenter's launch writes them)."""
    status: Obj = {"conditions": []}
    if launched:
        status["providerID"] = f"kwok://{name}"
        status["capacity"] = {GPU: capacity or gpus, "cpu": "32"}
    if terminating:
        status["conditions"].append({"type": "InstanceTerminating", "status": "True"})
    meta: Obj = {"name": name, "labels": {names.NODE_POOL_LABEL: pool_name}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"resources": {"requests": {GPU: gpus, "cpu": "1"}}},
        "status": status,
    }


def launched(*names_: str) -> list[Obj]:
    return [pool_claim(n, launched=True) for n in names_]


def unlaunched(*names_: str) -> list[Obj]:
    return [pool_claim(n) for n in names_]


@pytest.mark.parametrize(
    ("limits", "reported", "claims", "expected"),
    [
        ({GPU: "32"}, {}, unlaunched("a", "b", "c"), 1),
        ({GPU: "32"}, {}, launched("a", "b", "c"), 1),
        ({GPU: "32"}, {GPU: "24", "nodes": "3"}, launched("a", "b", "c"), 1),
        ({GPU: "32"}, {GPU: "16", "nodes": "2"}, launched("a", "b", "c"), 1),
        ({GPU: "32"}, {GPU: "24", "nodes": "3"}, launched("a", "b"), 1),
        ({GPU: "32"}, {GPU: "16"}, [*launched("a", "b"), *unlaunched("c")], 1),
        ({GPU: "32"}, {GPU: "24"}, [*launched("a", "b"), *unlaunched("c")], 0),
        ({GPU: "32"}, {}, [pool_claim("x", pool_name="other"), *unlaunched("a")], 3),
        (
            {GPU: "32"},
            {},
            [pool_claim("a", deleting=True), pool_claim("b", launched=True, terminating=True)],
            4,
        ),
        ({GPU: "32"}, {}, [pool_claim("a", gpus="8", capacity="16", launched=True)], 2),
        ({"nodes": "4"}, {"nodes": "1"}, [*launched("a"), *unlaunched("b", "c")], 1),
        ({"nodes": "4"}, {}, [pool_claim("k", gpus="0")], 3),
    ],
    ids=[
        "claims not launched yet count though Karpenter reports nothing of them",
        "launched claims Karpenter has not counted yet count",
        "launched claims Karpenter counted already are not counted twice",
        "a launched claim not yet counted by Karpenter counts once",
        "a claim gone since Karpenter counted still counts until it says so",
        "a claim not launched is never in status.resources: added to what Karpenter counted",
        "Karpenter's count and the claims it cannot know of add up",
        "claims of another pool are not charged",
        "claims being deleted or terminating are not charged, as in Karpenter",
        "a launched claim counts its instance's capacity, not what it asked",
        "a nodes limit counts every live claim once",
        "a claim of Karpenter's own asking nothing limited still takes a node",
    ],
)
def test_room_is_charged_with_every_claim_of_the_pool_once(
    limits: dict[str, str], reported: dict[str, str], claims: list[Obj], expected: int
) -> None:
    assert room(pool(limits=limits, used=reported), {GPU: "8"}, claims) == expected


def test_a_pools_use_tells_claims_counted_from_what_karpenter_reported() -> None:
    claims = [*launched("a"), *unlaunched("b"), pool_claim("c", deleting=True)]
    use = pool_use(pool(used={GPU: "16"}), claims)
    assert use.claims == 2
    assert [c["metadata"]["name"] for c in use.launched] == ["a"]
    assert [c["metadata"]["name"] for c in use.unlaunched] == ["b"]
    assert use.used(GPU) == 16 * 10**9 + 8 * 10**9


def test_no_room_names_the_limit_and_what_the_pools_claims_take() -> None:
    pools = {"gpu": pool(limits={GPU: "32"})}
    claims = unlaunched("a", "b", "c")
    choice = choose_pool(pools, ["gpu"], labels={}, per_node={GPU: "8"}, nodes=3, claims=claims)
    assert choice.pool is None and choice.no_room
    assert choice.problem == (
        "NodePool 'gpu': limits nvidia.com/gpu=32 leave room for 1 of 3 nodes "
        "(in use or asked, 3 NodeClaims counted: nvidia.com/gpu=24)"
    )


def test_flavor_labels_must_be_labels_the_pool_can_carry() -> None:
    p = pool(
        labels={"team": "ml"},
        requirements=[{"key": "gpu-type", "operator": "In", "values": ["h100"]}],
    )
    assert label_problem(p, "gpu-type", "h100") is None
    assert label_problem(p, "topology.kubernetes.io/zone", "a") is None
    assert "requires gpu-type In ['h100']" in str(label_problem(p, "gpu-type", "a100"))
    assert "sets team=ml, not infra" in str(label_problem(p, "team", "infra"))
    assert "does not define label rack" in str(label_problem(p, "rack", "r1"))


def test_the_first_pool_that_can_take_the_whole_gang_is_chosen() -> None:
    small = pool("small", limits={GPU: "24"})
    big = pool("big", limits={GPU: "64"})
    pools = {"small": small, "big": big}
    choice = choose_pool(pools, ["small", "big"], labels={}, per_node={GPU: "8"}, nodes=4)
    assert choice.pool is big


def test_no_room_anywhere_is_a_failed_attempt_not_a_bad_config() -> None:
    pools = {"gpu": pool(limits={GPU: "24"})}
    choice = choose_pool(pools, ["gpu"], labels={}, per_node={GPU: "8"}, nodes=4)
    assert choice.pool is None and choice.no_room
    assert choice.problem == "NodePool 'gpu': limits nvidia.com/gpu=24 leave room for 3 of 4 nodes"


def test_bad_pools_are_reported_naming_the_field() -> None:
    pools = {"gpu": pool()}
    choice = choose_pool(
        pools, ["missing", "gpu"], labels={"rack": "r1"}, per_node={GPU: "8"}, nodes=1
    )
    assert choice.pool is None and not choice.no_room
    assert choice.problem.startswith("spec.karpenter.nodePools[0]: NodePool 'missing' not found")
    assert "spec.karpenter.nodePools[1]: NodePool 'gpu' does not define label rack" in (
        choice.problem
    )


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"backend": "Karpenter"}, "spec.karpenter: required when spec.backend is Karpenter"),
        ({"karpenter": {"nodePools": ["gpu"]}}, "spec.karpenter: only with spec.backend"),
        (
            {"backend": "Karpenter", "karpenter": {"nodePools": ["gpu"]}},
            "spec.fulfillment.reclaimer: CordonAndTaint waits for cluster-autoscaler",
        ),
        (
            {
                "backend": "Karpenter",
                "karpenter": {"nodePools": []},
                "fulfillment": {"reclaimer": "DeleteNodeClaim"},
            },
            "spec.karpenter.nodePools",
        ),
    ],
    ids=[
        "the Karpenter backend needs its parameters",
        "Karpenter parameters need the Karpenter backend",
        "CordonAndTaint does not give a Karpenter node back",
        "at least one NodePool",
    ],
)
def test_bad_backend_configs_name_the_field(spec: Obj, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_spec(spec)


def test_a_karpenter_config_parses() -> None:
    spec = parse_spec(
        {
            "backend": "Karpenter",
            "karpenter": {"nodePools": ["gpu", "gpu-spare"]},
            "fulfillment": {"reclaimer": "DeleteNodeClaim"},
        }
    )
    assert spec.backend is Backend.KARPENTER
    assert spec.karpenter is not None and spec.karpenter.node_pools == ("gpu", "gpu-spare")
    assert parse_spec({}).backend is Backend.PROVISIONING_REQUEST
