"""The Karpenter provisioner against the fake API server: the room of a pool under gangs asking
together, and what it does without the Karpenter rights (403)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from gangcheck.kube.errors import ApiError, error_from_status
from gangcheck.kube.resources import (
    EVENT,
    NODE,
    NODE_CLAIM,
    NODE_POOL,
    POD,
    POD_TEMPLATE,
    PROVISIONING_REQUEST,
)
from gangcheck.logic.attempt.hold import hold_taint
from gangcheck.logic.sources.karpenter import access, names
from gangcheck.logic.sources.karpenter.claims import ClaimAsk, claim_bodies, claim_name
from gangcheck.model.names import (
    ARRIVED_FOR,
    CONSUME_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PHASE_ANNOTATION,
    RECLAIM_WHEN_IDLE,
    ROLLING_BACK,
    STARTED,
)
from gangcheck.model.provisioning_config import KARPENTER_CLASS
from gangcheck.reconcile.karpenter import ORPHAN_INTERVAL, RESYNC_SECONDS, KarpenterProvisioner
from gangcheck.reconcile.nodes import DrainingNodeReconciler
from tests.fakes.kube import FakeKube
from tests.unit.test_karpenter_logic import GPU, pool
from tests.waiting import Passes, PassesEnded

Obj = dict[str, Any]
NOW = datetime(2026, 12, 1, 10, 0, 5, tzinfo=UTC)
NAMESPACE = "team-a"
LOGGER = "gangcheck.reconcile.karpenter"


def gang_request(name: str, count: int = 3) -> Obj:
    """A request of the Karpenter class for ``count`` 8-GPU members, made by a Workload."""
    return {
        "apiVersion": PROVISIONING_REQUEST.api_version,
        "kind": PROVISIONING_REQUEST.kind,
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "ownerReferences": [
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "Workload",
                    "name": f"{name}-wl",
                    "uid": f"wl-{name}",
                }
            ],
        },
        "spec": {
            "provisioningClassName": KARPENTER_CLASS,
            "parameters": {"nodePools": "gpu"},
            "podSets": [{"podTemplateRef": {"name": f"ppt-{name}"}, "count": count}],
        },
    }


def template(name: str) -> Obj:
    return {
        "apiVersion": POD_TEMPLATE.api_version,
        "kind": POD_TEMPLATE.kind,
        "metadata": {
            "name": f"ppt-{name}",
            "namespace": NAMESPACE,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
        },
        "template": {
            "spec": {
                "containers": [{"name": "c", "resources": {"requests": {GPU: "8", "cpu": "1"}}}],
                "nodeSelector": {"team": "ml"},
            }
        },
    }


def node_pool(limits: dict[str, str], used: dict[str, str] | None = None) -> Obj:
    return pool(limits=limits, used=used, typed=True)


def stack(*gangs: str, limits: dict[str, str], used: dict[str, str] | None = None) -> FakeKube:
    kube = FakeKube(clock=lambda: NOW)
    kube.add(node_pool(limits, used))
    for name in gangs:
        kube.add(gang_request(name), template(name))
    return kube


def provisioner(kube: FakeKube) -> KarpenterProvisioner:
    return KarpenterProvisioner(kube, kube.caches(), clock=lambda: NOW)


def claims_of(kube: FakeKube, gang: str) -> list[Obj]:
    key = f"{NAMESPACE}/{gang}"
    return [
        c
        for c in kube.all_of(NODE_CLAIM)
        if (c["metadata"].get("annotations") or {}).get(names.REQUESTED_FOR) == key
    ]


def gpus(claims: list[Obj]) -> int:
    return sum(int(c["spec"]["resources"]["requests"][GPU]) for c in claims)


def condition(kube: FakeKube, gang: str, kind: str) -> Obj | None:
    request = kube.stored(PROVISIONING_REQUEST, gang, NAMESPACE) or {}
    found = [c for c in (request.get("status") or {}).get("conditions") or [] if c["type"] == kind]
    return found[0] if found else None


def launch(kube: FakeKube, claim: Obj) -> None:
    """Plays Karpenter's launch: a provider id and the instance's capacity."""
    claim["status"] = {"providerID": f"kwok://{claim['metadata']['name']}", "capacity": {GPU: "8"}}
    kube.add(claim)


# -- the room of a pool ---------------------------------------------------------------------


async def test_two_gangs_asking_in_one_pass_get_no_more_than_the_pools_limit() -> None:
    """32 GPUs, two gangs of 3 x 8 and status.resources saying nothing yet: one gang's claims
    are made, the other's request fails naming the limit and what the first gang's take."""
    kube = stack("a", "b", limits={GPU: "32"})
    await provisioner(kube).pass_once()
    assert gpus(kube.all_of(NODE_CLAIM)) == 24
    assert len(claims_of(kube, "a")) == 3 and claims_of(kube, "b") == []
    failed = condition(kube, "b", "Failed") or {}
    assert failed.get("reason") == "NodePoolLimits"
    assert failed["message"] == (
        "NodePool 'gpu': limits nvidia.com/gpu=32 leave room for 1 of 3 nodes "
        "(in use or asked, 3 NodeClaims counted: nvidia.com/gpu=24)"
    )


async def test_claims_made_in_an_earlier_pass_count_before_karpenter_counts_them() -> None:
    kube = stack("a", limits={GPU: "32"})
    await provisioner(kube).pass_once()
    kube.add(gang_request("b"), template("b"))
    await provisioner(kube).pass_once()  # a new process too: it reads what the server holds
    assert claims_of(kube, "b") == []
    assert (condition(kube, "b", "Failed") or {}).get("reason") == "NodePoolLimits"


async def test_claims_karpenter_counted_already_are_not_counted_twice() -> None:
    """48 GPUs: gang a's 3 launched claims are in status.resources (24) and listed; gang b's
    3 fit in the 24 left."""
    kube = stack("a", limits={GPU: "48"})
    await provisioner(kube).pass_once()
    for claim in claims_of(kube, "a"):
        launch(kube, claim)
    kube.add(node_pool({GPU: "48"}, {GPU: "24", "nodes": "3"}))
    kube.add(gang_request("b"), template("b"))
    await provisioner(kube).pass_once()
    assert len(claims_of(kube, "b")) == 3
    assert gpus(kube.all_of(NODE_CLAIM)) == 48


async def test_claims_being_deleted_give_their_room_back() -> None:
    kube = stack("a", limits={GPU: "32"})
    await provisioner(kube).pass_once()
    for claim in claims_of(kube, "a"):
        claim["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:04Z"
        kube.add(claim)
    kube.add(gang_request("b"), template("b"))
    await provisioner(kube).pass_once()
    assert len(claims_of(kube, "b")) == 3


async def test_claims_of_the_pool_karpenter_made_are_charged_too() -> None:
    kube = stack("a", limits={GPU: "32"})
    theirs = {
        "apiVersion": NODE_CLAIM.api_version,
        "kind": NODE_CLAIM.kind,
        "metadata": {"name": "gpu-x1", "labels": {names.NODE_POOL_LABEL: "gpu"}},
        "spec": {"resources": {"requests": {GPU: "16"}}},
    }
    kube.add(theirs)
    await provisioner(kube).pass_once()
    assert claims_of(kube, "a") == []
    assert "leave room for 2 of 3 nodes" in (condition(kube, "a", "Failed") or {})["message"]


# -- without the Karpenter rights -----------------------------------------------------------


async def run_passes(kube: FakeKube, passes: int) -> tuple[KarpenterProvisioner, list[float]]:
    sleep = Passes(passes)
    karpenter = KarpenterProvisioner(kube, kube.caches(), clock=lambda: NOW, sleep=sleep)
    with pytest.raises(PassesEnded):
        await karpenter.run()
    return karpenter, sleep.waits


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING
    ]


async def test_without_the_rights_it_is_said_once_naming_the_component_and_backs_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """NodeClaims not listable and the request's status not writable (the base RBAC alone):
    20 passes give one warning, one Event on the request and one on its Workload, both naming
    manifests/components/karpenter, and waits that double up to a minute."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    kube = stack("a", limits={GPU: "32"})
    kube.fail("list", NODE_CLAIM.kind, error=403, times=1000)
    kube.fail("patch", PROVISIONING_REQUEST.kind, error=403, times=1000)
    karpenter, waits = await run_passes(kube, 20)
    (warning,) = warnings(caplog)
    assert access.COMPONENT in warning and "list karpenter.sh NodeClaims" in warning
    events = kube.all_of(EVENT)
    assert sorted(e["involvedObject"]["kind"] for e in events) == [
        "ProvisioningRequest",
        "Workload",
    ]
    assert {e["reason"] for e in events} == {access.REASON}
    assert all(access.COMPONENT in e["message"] for e in events)
    assert waits[:6] == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0]
    assert set(waits[5:]) == {60.0}
    assert len([c for c in kube.calls if c.verb == "patch"]) == 1  # the Failed write, tried once
    assert karpenter.denials.message == warning.split("; requests of")[0]


async def test_where_the_status_may_be_written_the_request_fails_naming_the_component() -> None:
    kube = stack("a", limits={GPU: "32"})
    kube.fail("list", NODE_CLAIM.kind, error=403, times=1000)
    await run_passes(kube, 5)
    failed = condition(kube, "a", "Failed") or {}
    assert failed.get("reason") == access.REASON
    assert access.COMPONENT in failed["message"]


async def test_a_refusal_that_changes_is_said_again_and_permission_back_resumes_passes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    kube = stack("a", limits={GPU: "32"})
    kube.fail("list", NODE_POOL.kind, error=403, times=3)
    kube.fail("create", NODE_CLAIM.kind, error=403, times=3)
    # the component's rights missing, the status is not writable either (a request whose
    # Failed was written takes no claim once the cache has it: the pass stores its writes)
    kube.fail("patch", PROVISIONING_REQUEST.kind, error=403, times=2)
    _, waits = await run_passes(kube, 10)
    said = warnings(caplog)
    assert len(said) == 2
    assert "list karpenter.sh NodePools" in said[0]
    assert "create karpenter.sh NodeClaims" in said[1]
    assert waits[:6] == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0]
    # allowed again: a pass runs when something wakes it, else after the resync (the passes
    # no longer run every second)
    assert waits[6:] == [RESYNC_SECONDS] * 4
    assert len(claims_of(kube, "a")) == 3
    assert any("permitted again" in r.getMessage() for r in caplog.records)


async def test_without_requests_of_the_class_a_refusal_is_not_said() -> None:
    kube = FakeKube(clock=lambda: NOW)
    kube.fail("list", NODE_CLAIM.kind, error=403, times=1000)
    karpenter, waits = await run_passes(kube, 3)
    assert karpenter.denials.message is None
    assert kube.all_of(EVENT) == []
    # with no request of the class, passes wait for one (a request event wakes them) or for
    # the orphan sweep's interval
    assert waits == [ORPHAN_INTERVAL] * 3


async def test_passes_wake_on_a_request_of_the_class_and_tick_only_while_one_is_unanswered() -> (
    None
):
    """Passes are driven by changes: a request of the class wakes one; a request no pass has
    answered yet is looked at again in a second (it is asked once its first second passed);
    once answered, only changes (or the resync) bring the next pass."""
    kube = stack("a", limits={GPU: "32"})
    karpenter = provisioner(kube)
    karpenter.on_request(None, {"spec": {"provisioningClassName": "other.example.com"}})
    assert not karpenter._woken.is_set()
    karpenter.on_request(None, gang_request("a"))
    assert karpenter._woken.is_set()
    assert karpenter._next_delay() == karpenter.interval
    await karpenter.pass_once()
    assert len(claims_of(kube, "a")) == 3
    assert karpenter._next_delay() == RESYNC_SECONDS


async def test_a_request_rolling_back_before_it_was_answered_is_not_asked_nor_ticked_for() -> None:
    """A request of the class whose attempt rolls back (or is kept) before any pass answered
    it takes no new node: no claim is made for it, and it is no request waiting for its first
    ask, so the passes do not tick every second for it while it stays as the record."""
    kube = stack(limits={GPU: "32"})
    closing = gang_request("a")
    closing["metadata"]["annotations"] = {PHASE_ANNOTATION: ROLLING_BACK}
    kube.add(closing, template("a"))
    karpenter = provisioner(kube)
    await karpenter.pass_once()
    assert claims_of(kube, "a") == []
    assert karpenter._next_delay() == RESYNC_SECONDS


async def test_claims_still_launching_are_withdrawn_once_their_attempt_rolls_back() -> None:
    """A gang's claims made and launching when its attempt rolls back (its deadline, its gang
    gone): the next pass withdraws them, its request still there as the record (a PodGroup's
    backoff), and writes nothing on it (no claim lost is said). An arrived claim is the
    rollback's to reclaim: it stays."""
    kube = stack("a", limits={GPU: "32"})
    karpenter = provisioner(kube)
    await karpenter.pass_once()
    made = sorted(claims_of(kube, "a"), key=lambda c: c["metadata"]["name"])
    assert len(made) == 3
    arrived = made[0]
    arrived["status"] = {
        "nodeName": "n0",
        "conditions": [
            {"type": t, "status": "True"} for t in ("Launched", "Registered", "Initialized")
        ],
    }
    kube.add(arrived)
    for claim in made[1:]:
        launch(kube, claim)
    rolling = kube.stored(PROVISIONING_REQUEST, "a", NAMESPACE) or {}
    rolling["metadata"]["annotations"] = {PHASE_ANNOTATION: ROLLING_BACK}
    kube.add(rolling)
    kube.sync(karpenter._caches)
    before = kube.stored(PROVISIONING_REQUEST, "a", NAMESPACE) or {}
    await karpenter.pass_once()
    assert [c["metadata"]["name"] for c in claims_of(kube, "a")] == [arrived["metadata"]["name"]]
    deleted = sorted(w.name for w in kube.writes_of(NODE_CLAIM.kind, "delete"))
    assert deleted == sorted(c["metadata"]["name"] for c in made[1:])
    assert kube.stored(PROVISIONING_REQUEST, "a", NAMESPACE) == before
    kube.sync(karpenter._caches)
    await karpenter.pass_once()  # nothing more: the arrived claim stays, no condition
    assert len(kube.writes_of(NODE_CLAIM.kind, "delete")) == 2
    assert kube.stored(PROVISIONING_REQUEST, "a", NAMESPACE) == before


async def test_claims_withdrawn_are_told_to_the_cache_before_the_watch_brings_their_deletes() -> (
    None
):
    """The claims a pass withdraws leave the NodeClaim cache as their deletes are answered,
    as the reclaims' deletes do (`delete_told`): a decision before the watch's DELETED does
    not read them as launching (before, the cache kept them until the watch caught up)."""
    kube = stack("a", limits={GPU: "32"})
    karpenter = provisioner(kube)
    await karpenter.pass_once()
    made = claims_of(kube, "a")
    assert len(made) == 3
    rolling = kube.stored(PROVISIONING_REQUEST, "a", NAMESPACE) or {}
    rolling["metadata"]["annotations"] = {PHASE_ANNOTATION: ROLLING_BACK}
    kube.add(rolling)
    kube.sync(karpenter._caches)
    cached = {c["metadata"]["name"] for c in karpenter._caches.node_claims.store}
    assert cached == {c["metadata"]["name"] for c in made}
    await karpenter.pass_once()  # withdraws all three; no sync of the caches after it
    assert claims_of(kube, "a") == []
    assert [c["metadata"]["name"] for c in karpenter._caches.node_claims.store] == []


async def test_a_claim_lost_right_after_accepted_was_written_is_lost_not_made_again() -> None:
    """The pass that made a gang's claims writes Accepted; Karpenter deletes one of them
    (InsufficientCapacity) and the next pass runs before the requests watch brought the
    write: it judges on what was written (Failed NodeClaimLost), and makes no claim again as
    if the creation had been cut short."""
    kube = stack("a", limits={GPU: "32"})
    karpenter = provisioner(kube)
    await karpenter.pass_once()
    made = sorted(c["metadata"]["name"] for c in claims_of(kube, "a"))
    assert len(made) == 3 and condition(kube, "a", "Accepted") is not None
    kube.remove(NODE_CLAIM, made[1])
    await karpenter.pass_once()  # no sync: the cache has only what the pass wrote
    failed = condition(kube, "a", "Failed") or {}
    assert failed.get("reason") == "NodeClaimLost", failed
    assert len(kube.writes_of(NODE_CLAIM.kind, "create")) == 3
    assert sorted(c["metadata"]["name"] for c in claims_of(kube, "a")) == [made[0], made[2]]


# -- one gang's claims refused or failing: the others are served ----------------------------

WEBHOOK = 'admission webhook "claims.example.io" denied the request: NodeClaims need a cost-center'
VAP = "ValidatingAdmissionPolicy 'claims' with binding 'claims' denied request: no GPUs today"


def _refusal(status: int, message: str, *, causes: bool = False) -> ApiError:
    reason = {403: "Forbidden", 422: "Invalid", 500: "InternalError"}[status]
    details = {"causes": [{"message": message}]} if causes else {}
    body = {"kind": "Status", "reason": reason, "message": message, "code": status}
    return error_from_status(status, json.dumps({**body, "details": details}), target="x/y")


def second_claim(kube: FakeKube, gang: str) -> str:
    """The name of the gang's second claim (named by the request's name and uid)."""
    uid = (kube.stored(PROVISIONING_REQUEST, gang, NAMESPACE) or {})["metadata"]["uid"]
    return claim_name("gpu", f"{NAMESPACE}/{gang}", 1, uid)


@pytest.mark.parametrize(
    "error",
    [
        _refusal(403, WEBHOOK),  # a webhook's denial: a 403 that is no RBAC of gangcheck's
        _refusal(422, WEBHOOK),
        _refusal(403, f'nodeclaims.karpenter.sh "x" is forbidden: {VAP}'),
        _refusal(422, "NodeClaim.karpenter.sh is invalid: spec.requirements", causes=True),
    ],
)
async def test_a_claim_the_api_server_refuses_fails_its_request_quoting_it_and_the_next_is_served(
    error: ApiError, caplog: pytest.LogCaptureFixture
) -> None:
    kube = stack("a", "b", limits={GPU: "48"})
    kube.fail("create", NODE_CLAIM.kind, second_claim(kube, "a"), error=error)
    karpenter = provisioner(kube)
    await karpenter.pass_once()
    failed = condition(kube, "a", "Failed") or {}
    assert failed.get("reason") == "NodeClaimRefused", failed
    assert failed["message"] == (
        f"the API server refused NodeClaim {second_claim(kube, 'a')!r}: {error.message}"
    )
    assert condition(kube, "a", "Accepted") is None
    assert len(claims_of(kube, "b")) == 3  # served in the same pass
    assert karpenter.denials.message is None  # no 'RBAC not installed' said
    assert not any(access.COMPONENT in m for m in warnings(caplog))
    # the next pass withdraws the one claim made for a
    kube.sync(karpenter._caches)
    await karpenter.pass_once()
    assert claims_of(kube, "a") == []


@pytest.mark.parametrize("applied", [False, True], ids=["refused-500", "answer-lost"])
async def test_a_creation_cut_short_is_completed_by_the_next_pass_and_the_others_served(
    applied: bool,
) -> None:
    """A 500 on one gang's second claim (made or not: its answer lost on the way back): that
    gang's creation is cut short, the gangs after it in the pass are served; the next pass (of
    a new process, as after a restart) makes the missing claims under the attempt's own names
    and records the creation, withdrawing nothing. Before: the request failed
    NodeClaimsIncomplete and the claims made were withdrawn, the attempt rolled back."""
    kube = stack("a", "b", limits={GPU: "48"})
    kube.fail("create", NODE_CLAIM.kind, second_claim(kube, "a"), error=500, applied=applied)
    await provisioner(kube).pass_once()
    assert len(claims_of(kube, "b")) == 3
    assert len(claims_of(kube, "a")) == (2 if applied else 1)
    assert condition(kube, "a", "Accepted") is None
    await provisioner(kube).pass_once()  # a new process
    accepted = condition(kube, "a", "Accepted") or {}
    assert (accepted.get("reason"), accepted.get("message")) == (
        "NodeClaimsCompleted",
        "created 3 NodeClaims in NodePool 'gpu'",
    )
    assert condition(kube, "a", "Failed") is None
    uid = (kube.stored(PROVISIONING_REQUEST, "a", NAMESPACE) or {})["metadata"]["uid"]
    assert sorted(c["metadata"]["name"] for c in claims_of(kube, "a")) == sorted(
        claim_name("gpu", f"{NAMESPACE}/a", i, uid) for i in range(3)
    )
    assert kube.writes_of(NODE_CLAIM.kind, "delete") == []
    assert gpus(kube.all_of(NODE_CLAIM)) == 48


async def test_a_creation_cut_short_in_a_pool_filled_since_fails_saying_why() -> None:
    """The room the missing claims need was taken meanwhile (another gang's claim): the request
    fails NodeClaimsIncomplete naming the limit, and the claim made is withdrawn."""
    kube = stack("a", limits={GPU: "24"})
    kube.fail("create", NODE_CLAIM.kind, second_claim(kube, "a"), error=500)
    await provisioner(kube).pass_once()
    (made,) = claims_of(kube, "a")
    other = json.loads(json.dumps(made))
    other["metadata"] = {
        "name": "someone-elses",
        "labels": {names.NODE_POOL_LABEL: "gpu"},
    }
    kube.add(other)
    karpenter = provisioner(kube)
    await karpenter.pass_once()
    failed = condition(kube, "a", "Failed") or {}
    assert failed.get("reason") == "NodeClaimsIncomplete"
    assert failed["message"].startswith("1 of the 3 NodeClaims of this attempt exist")
    assert "limits nvidia.com/gpu=24 leave room for 1 of 2 nodes" in failed["message"]
    kube.sync(karpenter._caches)
    await karpenter.pass_once()
    assert claims_of(kube, "a") == []


async def test_claims_made_before_a_restart_that_lost_the_accepted_write_are_recorded() -> None:
    """gangcheck stopped after creating a gang's claims, before its Accepted write took (here:
    refused as stale): the next process finds the claims, records them and makes no more."""
    kube = stack("a", limits={GPU: "48"})
    kube.fail("patch", PROVISIONING_REQUEST.kind, "a", error=409)
    await provisioner(kube).pass_once()
    made = sorted(c["metadata"]["name"] for c in claims_of(kube, "a"))
    assert len(made) == 3 and condition(kube, "a", "Accepted") is None
    await provisioner(kube).pass_once()  # a new process
    accepted = condition(kube, "a", "Accepted") or {}
    assert (accepted.get("reason"), accepted.get("message")) == (
        "NodeClaimsFound",
        "created 3 NodeClaims in NodePool 'gpu'",
    )
    assert condition(kube, "a", "Failed") is None
    assert sorted(c["metadata"]["name"] for c in claims_of(kube, "a")) == made
    assert kube.writes_of(NODE_CLAIM.kind, "delete") == []


async def test_claims_made_before_a_create_failed_are_charged_to_the_next_gang_of_the_pass() -> (
    None
):
    """30 GPUs: gang a's first claim (8) is made, its second fails (500); gang b's 3 x 8 no
    longer fit in the 22 left, in the same pass."""
    kube = stack("a", "b", limits={GPU: "30"})
    kube.fail("create", NODE_CLAIM.kind, second_claim(kube, "a"), error=500)
    await provisioner(kube).pass_once()
    assert len(claims_of(kube, "a")) == 1
    assert claims_of(kube, "b") == []
    assert gpus(kube.all_of(NODE_CLAIM)) <= 30
    assert (condition(kube, "b", "Failed") or {}).get("reason") == "NodePoolLimits"


# -- claims outliving their request ---------------------------------------------------------


async def test_claims_of_a_gone_request_cost_one_live_read_until_they_change() -> None:
    """Gang a ran and its request is gone; its nodes live on as Karpenter's (other pods may run
    there). While gang b's request keeps passes running, a pass reads a's request once to know
    it gone and lets its claims go; later passes read it again only when one of its claims
    changed, not at every pass (on a busy cluster: one read per such gang per pass)."""
    kube = stack("a", "b", limits={GPU: "48"})
    karpenter = provisioner(kube)
    await karpenter.pass_once()
    for claim in claims_of(kube, "a"):
        claim["status"] = {
            "nodeName": f"node-{claim['metadata']['name']}",
            "conditions": [{"type": t, "status": "True"} for t in ("Launched", "Initialized")],
        }
        kube.add(claim)
    kube.remove(PROVISIONING_REQUEST, "a", NAMESPACE)
    kube.sync(karpenter._caches)
    reads = lambda: len(  # noqa: E731
        [c for c in kube.calls if c.verb == "get" and c.kind == PROVISIONING_REQUEST.kind]
    )
    for _ in range(3):
        await karpenter.pass_once()
    assert reads() == 1
    assert len(claims_of(kube, "a")) == 3  # arrived: left to the reclaim rules
    changed = claims_of(kube, "a")[0]
    changed["metadata"]["annotations"]["example.com/touched"] = "yes"
    kube.add(changed)
    await karpenter.pass_once()
    assert reads() == 2


@pytest.mark.parametrize(
    ("protecting", "held", "released"),
    [
        (True, False, False),  # the gang started (its hold lifted): the pool's word stays
        (True, True, False),
        (False, False, True),  # gangcheck's own protection: the request gone, it comes off
        # held for a request that is gone: it comes off too, as the hold does (the core lifts
        # the hold of a gone request, HoldLifted; an evicted gang's nodes are open to anyone)
        (False, True, True),
    ],
    ids=["protecting-started", "protecting-held", "own-started", "own-held"],
)
async def test_old_claims_of_a_gone_request_keep_their_pools_protection_with_no_request_left(
    protecting: bool, held: bool, released: bool
) -> None:
    """Claims the previous release made (no request uid, no gangcheck.io/pool-do-not-disrupt)
    in a NodePool whose template sets karpenter.sh/do-not-disrupt: once the last request of
    the class is gone, a pass still reads the pool's template and leaves the admin's
    protection on the claims and their nodes. Before, the pools were listed only while a
    request of the class existed, so the last request's going took it off."""
    kube = old_claims_stack(protecting=protecting, held=held)
    await provisioner(kube).pass_once()
    assert protected(kube) == [not released] * 4


async def test_old_claims_keep_their_protection_when_their_pools_cannot_be_read() -> None:
    """No request of the class and NodePools not readable (403): the pass goes on (nothing to
    ask for, no refusal said), and a claim whose pool's template is not read keeps it."""
    kube = old_claims_stack(protecting=False, held=False)
    kube.fail("list", NODE_POOL.kind, error=403)
    karpenter = provisioner(kube)
    await karpenter.pass_once()
    assert protected(kube) == [True] * 4
    assert karpenter.denials.message is None


def old_claims_stack(*, protecting: bool, held: bool) -> FakeKube:
    """Gang a's two claims as the release before gangcheck.io/request-uid made them, arrived
    on n0 and n1 (recorded for the request, held for it or not), its request gone."""
    kube = FakeKube(clock=lambda: NOW)
    pool_obj = node_pool({GPU: "48"})
    if protecting:
        template = pool_obj["spec"]["template"]
        template["metadata"]["annotations"] = {names.DO_NOT_DISRUPT: "true"}
    kube.add(pool_obj)
    key = f"{NAMESPACE}/a"
    for i, body in enumerate(claim_bodies(pool_obj, ClaimAsk(key, 2, {GPU: "8"}, {"team": "ml"}))):
        body["metadata"]["annotations"].pop(names.POOL_PROTECTED, None)
        body["metadata"]["creationTimestamp"] = "2026-12-01T10:00:01Z"
        body["status"] = {
            "nodeName": f"n{i}",
            "conditions": [{"type": t, "status": "True"} for t in ("Launched", "Initialized")],
        }
        kube.add(body)
        kube.add(
            {
                "apiVersion": "v1",
                "kind": NODE.kind,
                "metadata": {
                    "name": f"n{i}",
                    # recorded as arrived for the request
                    "annotations": {names.DO_NOT_DISRUPT: "true", ARRIVED_FOR: key},
                },
                "spec": {"taints": [hold_taint(key)] if held else []},
            }
        )
    return kube


def protected(kube: FakeKube) -> list[bool]:
    """Whether each claim, then n0 and n1, carries karpenter.sh/do-not-disrupt."""
    objects = [*kube.all_of(NODE_CLAIM), *(kube.stored(NODE, f"n{i}") or {} for i in range(2))]
    return [
        (o["metadata"].get("annotations") or {}).get(names.DO_NOT_DISRUPT) == "true"
        for o in objects
    ]


# -- a node kept after its withdrawal --------------------------------------------------------


def _hold_on(kube: FakeKube, name: str) -> bool:
    taints = ((kube.stored(NODE, name) or {}).get("spec") or {}).get("taints") or []
    return any(t["key"] == hold_taint(f"{NAMESPACE}/a")["key"] for t in taints)


def _marked(kube: FakeKube, name: str, mark: bool) -> None:
    node = kube.stored(NODE, name) or {}
    notes = node["metadata"]["annotations"]
    if mark:
        notes[RECLAIM_WHEN_IDLE] = "{}"
    else:
        notes.pop(RECLAIM_WHEN_IDLE, None)
    kube.add(node)


async def test_a_node_kept_after_its_withdrawal_has_its_hold_lifted_by_a_later_pass() -> None:
    """Gang a's request gone; its two nodes recorded for it (the withdrawal's reclaim wrote
    the record with its mark), still held. n0 was kept later by the draining-node reconciler
    (its mark gone: the reclaim had drained, or this process stopped between the mark and the
    reclaim); n1 still owes its reclaim. A pass lifts n0's hold, every other taint kept, and
    leaves n1's until it is kept too; a mark the cache does not show yet (read live) leaves
    the hold on. Before, only the withdrawal's own reclaim lifted a hold: both nodes stayed
    closed to every pod but a dead gang's, for ever with consolidation off."""
    kube = old_claims_stack(protecting=False, held=True)
    other = {"key": "example.com/gpu", "value": "true", "effect": "NoSchedule"}
    for name in ("n0", "n1"):
        node = kube.stored(NODE, name) or {}
        node["spec"]["taints"].insert(0, other)
        kube.add(node)
    _marked(kube, "n1", True)
    karpenter = provisioner(kube)
    _marked(kube, "n0", True)  # marked again since the cache was read: owed a reclaim
    await karpenter.pass_once()
    assert (_hold_on(kube, "n0"), _hold_on(kube, "n1")) == (True, True)
    _marked(kube, "n0", False)  # kept
    kube.sync(karpenter._caches)
    karpenter._since_orphan_pass = ORPHAN_INTERVAL  # no request of the class: every 30 s
    await karpenter.pass_once()
    assert (_hold_on(kube, "n0"), _hold_on(kube, "n1")) == (False, True)
    assert (kube.stored(NODE, "n0") or {})["spec"]["taints"] == [other]
    _marked(kube, "n1", False)
    kube.sync(karpenter._caches)
    karpenter._since_orphan_pass = ORPHAN_INTERVAL
    await karpenter.pass_once()
    assert (_hold_on(kube, "n0"), _hold_on(kube, "n1")) == (False, False)


async def test_a_mark_coming_off_a_held_node_wakes_a_pass_that_lifts_its_hold_at_once() -> None:
    """Gang a's request gone, n0 recorded for it and held, a reclaim still owed it (marked).
    The draining-node reconciler keeps it (the mark comes off): that change wakes a pass,
    which runs though no request of the class is left, and lifts n0's hold. Before, nothing
    woke the provisioner on a node's change, and a woken pass with no request of the class
    did nothing until the orphan interval had passed: the hold stayed up to 30 s (10 s with
    requests of the class in flight, the resync)."""
    kube = old_claims_stack(protecting=False, held=True)
    _marked(kube, "n0", True)
    _marked(kube, "n1", True)
    caches = kube.caches()
    passes: list[tuple[bool, bool]] = []

    async def sleep(seconds: float) -> None:
        passes.append((_hold_on(kube, "n0"), _hold_on(kube, "n1")))
        if len(passes) == 2:
            raise PassesEnded
        assert seconds == ORPHAN_INTERVAL  # no request of the class: nothing else is due
        old = caches.nodes.store.get("n0")
        _marked(kube, "n0", False)  # kept by the draining-node reconciler
        kube.sync(caches)
        karpenter.on_node(old, caches.nodes.store.get("n0"))

    karpenter = KarpenterProvisioner(kube, caches, clock=lambda: NOW, sleep=sleep)
    with pytest.raises(PassesEnded):
        await karpenter.run()
    assert passes == [(True, True), (False, True)]


@pytest.mark.parametrize(
    ("before", "after", "wakes"),
    [
        ("recorded held marked", "recorded held", True),  # kept: its hold may come off
        ("recorded held", "recorded held marked", False),  # a reclaim owed it now
        ("recorded marked", "recorded", False),  # not held: nothing to lift
        ("held marked", "held", False),  # recorded by no one: the withdrawal's, not a lift
        ("recorded held", "recorded held", False),  # another change (a heartbeat)
    ],
)
def test_which_node_changes_wake_a_pass(before: str, after: str, wakes: bool) -> None:
    kube = stack(limits={GPU: "32"})
    karpenter = provisioner(kube)

    def node(kind: str) -> Obj:
        notes = {ARRIVED_FOR: f"{NAMESPACE}/a"} if "recorded" in kind else {}
        if "marked" in kind:
            notes[RECLAIM_WHEN_IDLE] = "{}"
        taints = [hold_taint(f"{NAMESPACE}/a")] if "held" in kind else []
        return {"metadata": {"name": "n0", "annotations": notes}, "spec": {"taints": taints}}

    karpenter.on_node(node(before), node(after))
    assert karpenter._woken.is_set() is wakes
    karpenter._woken.clear()
    karpenter.on_node(None, node(after))  # a node seen for the first time: no lift owed
    assert not karpenter._woken.is_set()


# -- claims of a gang that started ------------------------------------------------------------


def started_stack(claims: int, *, accepted: bool) -> FakeKube:
    """Gang a started (every member scheduled), its request's uid ``uid-a``, ``claims`` claims
    of its attempt made in the second after it, ``Accepted`` written or not (a create's answer
    lost, a restart between create and record)."""
    kube = FakeKube(clock=lambda: NOW)
    pool_obj = node_pool({GPU: "64"})
    kube.add(pool_obj, template("a"))
    request = gang_request("a", count=claims)
    request["metadata"]["uid"] = "uid-a"
    request["metadata"]["annotations"] = {PHASE_ANNOTATION: STARTED}
    if accepted:
        message = f"created {claims} NodeClaims in NodePool 'gpu'"
        request["status"] = {
            "conditions": [
                {"type": "Accepted", "status": "True", "reason": "R", "message": message}
            ]
        }
    kube.add(request)
    ask = ClaimAsk(f"{NAMESPACE}/a", claims, {GPU: "8"}, {"team": "ml"}, uid="uid-a")
    for body in claim_bodies(pool_obj, ask):
        body["metadata"]["creationTimestamp"] = "2026-12-01T10:00:01Z"
        kube.add(body)
    return kube


def registered(kube: FakeKube, claim: Obj, node: str, *, key: str = f"{NAMESPACE}/a") -> None:
    """Karpenter's part: ``claim``'s node registered, held for ``key`` (the claim's taints),
    owned by the claim, the claim naming it."""
    stored = kube.stored(NODE_CLAIM, claim["metadata"]["name"]) or {}
    stored["status"] = {
        "nodeName": node,
        "providerID": f"kwok://{node}",
        "conditions": [{"type": t, "status": "True"} for t in ("Launched", "Registered")],
    }
    kube.add(stored)
    kube.add(
        {
            "apiVersion": "v1",
            "kind": NODE.kind,
            "metadata": {
                "name": node,
                "creationTimestamp": "2026-12-01T10:00:02Z",
                "ownerReferences": [
                    {
                        "apiVersion": names.API_VERSION,
                        "kind": names.NODE_CLAIM_KIND,
                        "name": stored["metadata"]["name"],
                        "uid": stored["metadata"]["uid"],
                    }
                ],
            },
            "spec": {"providerID": f"kwok://{node}", "taints": [hold_taint(key)]},
        }
    )


def bound(kube: FakeKube, name: str, node: str, *, gang: str = "") -> None:
    """A pod running on ``node``: of gang ``gang`` (consuming its request) or of no one's."""
    kube.add(
        {
            "apiVersion": "v1",
            "kind": POD.kind,
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "annotations": {CONSUME_ANNOTATION: gang} if gang else {},
            },
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running"},
        }
    )


def notes_of(kube: FakeKube, node: str) -> dict[str, str]:
    return dict(((kube.stored(NODE, node) or {}).get("metadata") or {}).get("annotations") or {})


async def test_a_started_gangs_claims_it_does_not_run_on_are_withdrawn_safely() -> None:
    """Gang a started; its four claims were made, never recorded (no Accepted). Claim 0 has no
    node: deleted (conditional on its uid). Claim 1's node is empty: reclaimed (fenced, its
    pods read live), the claim deleted. Claim 2's node runs a pod of someone else's: kept,
    said, its hold lifted, the claim stays. Claim 3's node runs a member of the gang: handed
    over to it (no reclaim's mark left, its hold lifted), the claim stays. Before, all four
    stayed as they were: three machines held for a gang that did not need them and kept from
    Karpenter's disruption (do-not-disrupt stays while held) for as long as it ran."""
    kube = started_stack(4, accepted=False)
    made = sorted(claims_of(kube, "a"), key=lambda c: c["metadata"]["name"])
    by_index = {int(c["metadata"]["annotations"][names.CLAIM_INDEX]): c for c in made}
    for i in (1, 2, 3):
        registered(kube, by_index[i], f"n{i}")
    bound(kube, "theirs", "n2")
    bound(kube, "member-0", "n3", gang="a")
    karpenter = provisioner(kube)
    await karpenter.pass_once()
    left = {c["metadata"]["name"] for c in claims_of(kube, "a")}
    assert left == {by_index[2]["metadata"]["name"], by_index[3]["metadata"]["name"]}
    (deleted,) = [
        c.body
        for c in kube.writes_of(NODE_CLAIM.kind, "delete")
        if c.name == by_index[0]["metadata"]["name"]
    ]
    assert deleted["uid"] == by_index[0]["metadata"]["uid"]  # conditional on the claim read
    assert (_hold_on(kube, "n2"), _hold_on(kube, "n3")) == (False, False)
    for node in ("n2", "n3"):
        assert RECLAIM_WHEN_IDLE not in notes_of(kube, node), node
        assert notes_of(kube, node)[ARRIVED_FOR] == f"{NAMESPACE}/a"
    assert {
        e["involvedObject"]["name"] for e in kube.all_of(EVENT) if e["reason"] == "NodeKept"
    } == {"n2"}
    kube.sync(karpenter._caches)
    await karpenter.pass_once()  # again: nothing more
    assert {c["metadata"]["name"] for c in claims_of(kube, "a")} == left


def started_on_an_earlier_claim() -> tuple[FakeKube, Obj]:
    """Gang a started, its member on node n0 of a claim of an earlier request of its name
    (another uid); its own claim gone since the start (no matter). The stack and that claim."""
    kube = started_stack(1, accepted=True)
    (own,) = claims_of(kube, "a")
    kube.remove(NODE_CLAIM, own["metadata"]["name"])
    ask = ClaimAsk(f"{NAMESPACE}/a", 1, {GPU: "8"}, {"team": "ml"}, uid="uid-earlier")
    (earlier,) = claim_bodies(node_pool({GPU: "64"}), ask)
    earlier["metadata"]["creationTimestamp"] = "2026-12-01T09:59:50Z"
    kube.add(earlier)
    registered(kube, earlier, "n0")
    bound(kube, "member-0", "n0", gang="a")
    return kube, earlier


async def test_a_gang_started_on_an_earlier_requests_claim_is_handed_the_node_not_drained() -> None:
    """A claim of an earlier request of gang a's name (another uid), its node held under the
    name and kept while the live request's gang might use it: the gang started there (its
    member on the node). The withdrawal's reclaim finds the gang's pod (drain): the node is
    handed over, its mark off and its hold lifted, the claim kept; the draining-node
    reconciler has nothing to look at. Before, the mark stayed and the draining-node
    reconciler looked at the node every 2 s (DRAIN_POLL_SECONDS: a live read of the node and
    two pod lists each time) for as long as the gang ran, and reclaimed the node once it
    ended, though it was the gang's as much as its own claims' nodes."""
    kube, earlier = started_on_an_earlier_claim()
    karpenter = provisioner(kube)
    await karpenter.pass_once()
    assert RECLAIM_WHEN_IDLE not in notes_of(kube, "n0")
    assert notes_of(kube, "n0")[ARRIVED_FOR] == f"{NAMESPACE}/a"
    assert not _hold_on(kube, "n0")
    assert [c["metadata"]["name"] for c in claims_of(kube, "a")] == [earlier["metadata"]["name"]]
    kube.sync(karpenter._caches)
    looked = await DrainingNodeReconciler(kube, karpenter._caches, clock=lambda: NOW).reconcile(
        "n0"
    )
    assert looked.requeue_after is None
    await karpenter.pass_once()  # again: nothing more
    assert notes_of(kube, "n0").get(RECLAIM_WHEN_IDLE) is None
    assert len(claims_of(kube, "a")) == 1


async def test_a_restart_between_the_drain_and_the_hand_over_leaves_it_to_the_draining_reconciler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As above, but gangcheck stops right after the withdrawal's reclaim found the started
    gang's pod on the node (drain), before the hand-over: the mark stays. The draining-node
    reconciler, reading it after the restart, hands the node over in turn (mark off, hold
    lifted, nothing requeued), where it used to read the node every 2 s for as long as the
    gang ran and reclaim it once the gang's pods were gone, a member's replacement not bound
    yet among them."""
    kube, earlier = started_on_an_earlier_claim()

    async def stopped(*_: Any, **__: Any) -> bool:
        return False  # the process ends here: nothing written

    monkeypatch.setattr("gangcheck.reconcile.karpenter.hand_over", stopped)
    karpenter = provisioner(kube)
    await karpenter.pass_once()
    assert RECLAIM_WHEN_IDLE in notes_of(kube, "n0")
    assert _hold_on(kube, "n0")
    monkeypatch.undo()
    restarted = provisioner(kube)
    kube.sync(restarted._caches)
    looked = await DrainingNodeReconciler(kube, restarted._caches, clock=lambda: NOW).reconcile(
        "n0"
    )
    assert looked.requeue_after is None
    assert RECLAIM_WHEN_IDLE not in notes_of(kube, "n0")
    assert notes_of(kube, "n0")[ARRIVED_FOR] == f"{NAMESPACE}/a"
    assert not _hold_on(kube, "n0")
    assert [c["metadata"]["name"] for c in claims_of(kube, "a")] == [earlier["metadata"]["name"]]
    await restarted.pass_once()  # and the provisioner leaves it so
    assert RECLAIM_WHEN_IDLE not in notes_of(kube, "n0")
    assert len(claims_of(kube, "a")) == 1
