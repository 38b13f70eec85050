"""gangcheck serving its Karpenter class: one request, its claims, what is done (pure)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gangcheck.logic.attempt.hold import HOLD_TAINT, hold_value
from gangcheck.logic.sources.karpenter import names
from gangcheck.logic.sources.karpenter.claims import ClaimAsk, claim_bodies, claim_name
from gangcheck.logic.sources.karpenter.packing import PackedClaim
from gangcheck.logic.sources.karpenter.provisioner import Served, is_asking, reads_pools, serve
from gangcheck.model.names import (
    ARRIVED_FOR,
    KEPT,
    OUTCOME_ANNOTATION,
    PHASE_ANNOTATION,
    ROLLING_BACK,
    STARTED,
)
from gangcheck.model.provisioning_config import KARPENTER_CLASS
from tests.unit.test_karpenter_logic import GPU, pool

Obj = dict[str, Any]
KEY = "team-a/train-check-1"
NOW = datetime(2026, 12, 1, 10, 0, 5, tzinfo=UTC)
LABELS = {"team": "ml"}


def request(*conditions: tuple[str, ...], created: str = "2026-12-01T10:00:00Z") -> Obj:
    return {
        "metadata": {
            "name": "train-check-1",
            "namespace": "team-a",
            "creationTimestamp": created,
            "resourceVersion": "7",
        },
        "spec": {
            "provisioningClassName": KARPENTER_CLASS,
            "parameters": {"nodePools": "gpu"},
            "podSets": [{"podTemplateRef": {"name": "ppt-train-main"}, "count": 2}],
        },
        "status": {
            "conditions": [
                {"type": c[0], "status": c[1], "reason": "R", "message": "".join(c[2:])}
                for c in conditions
            ]
        },
    }


TEMPLATES = {
    "ppt-train-main": {
        "template": {
            "spec": {
                "containers": [
                    {"resources": {"requests": {GPU: "8", "cpu": "2"}}},
                    {"resources": {"requests": {"cpu": "500m"}}},
                ],
                "nodeSelector": LABELS,
            }
        }
    }
}


def claims(*conditions: str, node: str = "n") -> list[Obj]:
    bodies = claim_bodies(pool(), ClaimAsk(KEY, 2, {GPU: "8"}, LABELS))
    for i, body in enumerate(bodies):
        body["status"] = {
            "conditions": [{"type": c, "status": "True"} for c in conditions],
            # Karpenter names the node at the claim's registration
            "nodeName": f"{node}{i}" if {"Registered", "Initialized"} & set(conditions) else "",
        }
    return bodies


def held(name: str, *, protected: bool = True) -> Obj:
    return {
        "metadata": {
            "name": name,
            "annotations": {names.DO_NOT_DISRUPT: "true"} if protected else {},
        },
        "spec": {"taints": [{"key": HOLD_TAINT, "value": hold_value(KEY), "effect": "NoSchedule"}]},
    }


def served(
    req: Obj | None,
    made: list[Obj],
    pools: dict[str, Obj | None] | None = None,
    *,
    nodes: dict[str, Obj] | None = None,
    now: datetime = NOW,
) -> Served:
    return serve(
        req,
        KEY,
        templates=TEMPLATES,
        claims=made,
        pools={"gpu": pool()} if pools is None else pools,
        nodes=nodes or {},
        now=now,
    )


def test_a_new_request_gets_one_claim_per_member_sized_like_a_member() -> None:
    done = served(request(), [])
    assert len(done.create) == 2
    assert done.create[0]["spec"]["resources"]["requests"] == {GPU: "8", "cpu": "2500m"}
    assert [(c["type"], c["status"]) for c in done.conditions] == [("Accepted", "True")]


def test_no_claim_is_made_in_the_requests_own_second() -> None:
    same_second = datetime(2026, 12, 1, 10, 0, 0, 900000, tzinfo=UTC)
    assert served(request(), [], now=same_second).create == ()


def test_a_pool_without_room_fails_the_request_naming_the_limit() -> None:
    full = pool(limits={GPU: "8"})
    done = served(request(), [], pools={"gpu": full})
    assert done.create == ()
    (failed,) = done.conditions
    assert (failed["type"], failed["reason"]) == ("Failed", "NodePoolLimits")
    assert "leave room for 1 of 2 nodes" in failed["message"]


def test_a_missing_pool_fails_the_request_naming_the_field() -> None:
    (failed,) = served(request(), [], pools={}).conditions
    assert failed["reason"] == "NodePoolNotUsable"
    assert "spec.karpenter.nodePools[0]: NodePool 'gpu' not found" in failed["message"]


def test_claims_all_initialized_provision_the_request() -> None:
    done = served(request(("Accepted", "True")), claims("Launched", "Registered", "Initialized"))
    assert [(c["type"], c["status"]) for c in done.conditions] == [("Provisioned", "True")]


def test_a_claim_lost_before_it_arrived_fails_the_request() -> None:
    made = claims("Launched")[:1]
    (failed,) = served(request(("Accepted", "True")), made).conditions
    assert (failed["type"], failed["reason"]) == ("Failed", "NodeClaimLost")
    assert "0 of 2 NodeClaims arrived; 1 lost" in failed["message"]


def test_claims_all_launched_provision_the_request_noting_how_many_arrived() -> None:
    done = served(request(("Accepted", "True")), claims("Launched"))
    (provisioned,) = done.conditions
    assert (provisioned["status"], provisioned["reason"]) == ("True", "NodeClaimsLaunched")
    assert provisioned["message"] == "0 of 2 NodeClaims arrived"


def test_an_ended_request_leaves_recorded_or_unheld_nodes_to_the_reclaim_rules() -> None:
    arrived = claims("Launched", "Registered", "Initialized")
    recorded, unheld = held("n0"), held("n1")
    recorded["metadata"]["annotations"]["gangcheck.io/arrived-for"] = KEY
    unheld["spec"]["taints"] = []
    ended = request(("Accepted", "True"), ("Failed", "True"))
    assert served(ended, arrived, nodes={"n0": recorded, "n1": unheld}).delete == ()
    assert served(ended, arrived).delete == ()  # nodes not seen: kept


def test_an_ended_request_withdraws_arrived_claims_the_ledger_never_recorded() -> None:
    """Through the reclaim's safe path (their nodes exist), never deleted here."""
    arrived = claims("Launched", "Registered", "Initialized")
    ended = request(("Accepted", "True"), ("Failed", "True"))
    done = served(ended, arrived, nodes={"n0": held("n0"), "n1": held("n1")})
    assert done.delete == () and done.reclaim == tuple(arrived)


def test_an_ended_request_withdraws_the_claims_not_arrived() -> None:
    made = claims("Launched")
    done = served(request(("Accepted", "True"), ("Failed", "True")), made)
    assert [c["metadata"]["name"] for c in done.delete] == [c["metadata"]["name"] for c in made]
    assert done.conditions == ()


def test_a_gone_request_lets_go_of_arrived_nodes_and_leaves_them_to_the_reclaim() -> None:
    made = claims("Launched", "Registered", "Initialized")
    nodes = {"n0": held("n0"), "n1": held("n1")}
    for node in nodes.values():
        node["metadata"]["annotations"]["gangcheck.io/arrived-for"] = KEY
    done = served(None, made, nodes=nodes)
    assert done.delete == ()
    assert ("node", "n0") in done.release and ("claim", made[0]["metadata"]["name"]) in done.release


def test_protection_stays_while_the_node_is_held_and_goes_once_the_hold_is_lifted() -> None:
    made = claims("Launched", "Registered", "Initialized")
    live = request(("Accepted", "True"), ("Provisioned", "True"))
    assert served(live, made, nodes={"n0": held("n0"), "n1": held("n1")}).release == ()
    started = held("n0")
    started["spec"]["taints"] = []
    done = served(live, made, nodes={"n0": started, "n1": held("n1")})
    assert done.release == (("node", "n0"), ("claim", made[0]["metadata"]["name"]))


# -- claims the request never recorded: gangcheck restarted (or its write lost) between ----
# creating the claims and writing Accepted. The claims say how many the attempt made.


def packed_claims(*conditions: str) -> list[Obj]:
    """One claim for both members (a packed gang: fewer claims than members)."""
    both = PackedClaim({GPU: 16}, ("member 0", "member 1"))
    bodies = claim_bodies(pool(), ClaimAsk.packing(KEY, [both], LABELS))
    for body in bodies:
        body["status"] = {"conditions": [{"type": c, "status": "True"} for c in conditions]}
    return bodies


@pytest.mark.parametrize(
    ("made", "accepted", "provisioned"),
    [
        # A packed gang: 1 claim for 2 members; read as 2 asked, one was 'lost'.
        (packed_claims("Launched"), "created 1 NodeClaims for 2 members in NodePool 'gpu'", "True"),
        (packed_claims(), "created 1 NodeClaims for 2 members in NodePool 'gpu'", "False"),
        # One claim per member: followed, and Accepted recorded so that claims gone later are
        # a loss, not a reason to ask again.
        (claims(), "created 2 NodeClaims in NodePool 'gpu'", "False"),
        (claims("Launched"), "created 2 NodeClaims in NodePool 'gpu'", "True"),
    ],
)
def test_claims_made_but_never_recorded_are_recorded_and_followed_not_lost(
    made: list[Obj], accepted: str, provisioned: str
) -> None:
    done = served(request(), made)
    assert done.create == () and done.delete == ()
    kinds = {c["type"]: c for c in done.conditions}
    assert "Failed" not in kinds, kinds
    assert (kinds["Accepted"]["status"], kinds["Accepted"]["reason"]) == ("True", "NodeClaimsFound")
    assert kinds["Accepted"]["message"] == accepted
    assert kinds["Provisioned"]["status"] == provisioned


def _deleting(claim: Obj) -> Obj:
    claim["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:03Z"
    return claim


def asked(*conditions: str) -> list[Obj]:
    """The claims a new request is served with (as the template asks), with ``conditions``."""
    bodies = [dict(c) for c in served(request(), []).create]
    for body in bodies:
        body["status"] = {"conditions": [{"type": c, "status": "True"} for c in conditions]}
    return bodies


def _asking_four_gpus() -> dict[str, Obj]:
    spec = {"containers": [{"resources": {"requests": {GPU: "4"}}}], "nodeSelector": LABELS}
    return {"ppt-train-main": {"template": {"spec": spec}}}


@pytest.mark.parametrize(
    ("made", "pools", "templates", "made_indexes", "outcome"),
    [
        # Cut short (gangcheck stopped between two creates, a create's answer lost, a 500):
        # the missing claims are made, under the names the attempt gives them, and the
        # creation is recorded; nothing is withdrawn, the attempt goes on.
        (asked("Launched")[:1], None, None, [1], ("Accepted", "NodeClaimsCompleted")),
        (asked()[1:], None, None, [0], ("Accepted", "NodeClaimsCompleted")),
        # A claim being deleted before it was recorded: Karpenter deletes a claim it cannot
        # launch (or someone deleted it), a loss as after Accepted; its name is still taken.
        (
            [asked()[0], _deleting(asked()[1])],
            None,
            None,
            [],
            ("Failed", "NodeClaimLost", "0 of 2 NodeClaims arrived; 1 lost"),
        ),
        # The missing ones cannot be made as the others were: the request fails saying why.
        (
            asked()[:1],
            {},
            None,
            [],
            ("Failed", "NodeClaimsIncomplete", "NodePool 'gpu' not found"),
        ),
        (
            asked()[:1],
            {"gpu": pool(limits={GPU: "8"})},
            None,
            [],
            ("Failed", "NodeClaimsIncomplete", "leave room for 0 of 1 nodes"),
        ),
        (
            asked()[:1],
            None,
            _asking_four_gpus(),
            [],
            ("Failed", "NodeClaimsIncomplete", "the gang's pods no longer ask what they were made"),
        ),
        (asked()[:1], None, {}, [], ("Failed", "NodeClaimsIncomplete", "PodTemplate")),
    ],
    ids=[
        "second-missing",
        "first-missing",
        "one-being-deleted",
        "pool-gone",
        "no-room-left",
        "pods-changed",
        "template-gone",
    ],
)
def test_a_creation_cut_short_makes_the_missing_claims_unless_they_cannot_be_made_as_asked(
    made: list[Obj],
    pools: dict[str, Obj | None] | None,
    templates: dict[str, Obj] | None,
    made_indexes: list[int],
    outcome: tuple[str, ...],
) -> None:
    every = {c["metadata"]["name"] for c in asked()}
    pool_claims = [c for c in made if not c["metadata"].get("deletionTimestamp")]
    # every claim of the pools is read to charge the room of the missing ones
    assert is_asking(request(), KEY, made, NOW) == (outcome[1] != "NodeClaimLost")
    done = serve(
        request(),
        KEY,
        templates=TEMPLATES if templates is None else templates,
        claims=made,
        pools={"gpu": pool()} if pools is None else pools,
        nodes={},
        now=NOW,
        pool_claims=pool_claims,
    )
    assert [c["metadata"]["annotations"][names.CLAIM_INDEX] for c in done.create] == [
        str(i) for i in made_indexes
    ]
    assert {c["metadata"]["name"] for c in done.create} <= every  # the attempt's own names
    assert done.delete == ()
    (condition,) = done.conditions
    assert (condition["type"], condition["status"], condition["reason"]) == (
        outcome[0],
        "True",
        outcome[1],
    )
    if outcome[0] == "Accepted":
        assert condition["message"] == "created 2 NodeClaims in NodePool 'gpu'"
    else:
        assert outcome[2] in condition["message"], condition["message"]


def test_a_creation_cut_short_that_fails_withdraws_the_claims_made() -> None:
    made = claims("Launched")[:1]
    (failed,) = served(request(), made, pools={}).conditions
    assert failed["message"].startswith(
        "1 of the 2 NodeClaims of this attempt exist and none was recorded as made: "
        "their creation was cut short"
    ), failed["message"]
    ended = request(("Failed", "True"))
    assert [c["metadata"]["name"] for c in served(ended, made).delete] == [
        made[0]["metadata"]["name"]
    ]


@pytest.mark.parametrize("phase", [ROLLING_BACK, KEPT])
def test_no_claim_is_made_for_an_attempt_no_longer_open(phase: str) -> None:
    """An attempt rolling back (its deadline, its gang gone, a growth's start watchdog) or
    kept takes no new node: neither a creation cut short is completed for it nor a first
    one asked. The claims made are withdrawn at once when it rolls back; a kept one's stay
    until its request ends."""
    closing = request()
    closing["metadata"]["annotations"] = {PHASE_ANNOTATION: phase}
    made = asked()[:1]  # 1 of the 2 claims the attempt makes
    assert not is_asking(closing, KEY, made, NOW)
    done = serve(
        closing,
        KEY,
        templates=TEMPLATES,
        claims=made,
        pools={"gpu": pool()},
        nodes={},
        now=NOW,
        pool_claims=made,
    )
    withdrawn = tuple(made) if phase == ROLLING_BACK else ()
    assert (done.create, done.delete, done.conditions) == ((), withdrawn, ())
    assert not is_asking(closing, KEY, [], NOW)
    assert served(closing, []) == Served()


def _recorded(name: str) -> Obj:
    node = held(name)
    node["metadata"]["annotations"][ARRIVED_FOR] = KEY
    return node


ROLLED_BACK = {PHASE_ANNOTATION: ROLLING_BACK, OUTCOME_ANNOTATION: '{"reclaimed": []}'}


@pytest.mark.parametrize(
    ("notes", "states", "nodes", "withdrawn", "reclaimed"),
    [
        # rolling back: the claims still launching are withdrawn now, not once it ends
        ({PHASE_ANNOTATION: ROLLING_BACK}, [(), ("Launched",)], {}, {0, 1}, set()),
        # rolled back (its outcome recorded), the request staying as the record (backoff)
        (ROLLED_BACK, [("Launched",), ("Launched",)], {}, {0, 1}, set()),
        ({OUTCOME_ANNOTATION: '{"reclaimed": []}'}, [("Launched",), ()], {}, {0, 1}, set()),
        # arrived: the rollback's to reclaim, recorded or not, held or not
        (
            {PHASE_ANNOTATION: ROLLING_BACK},
            [("Launched", "Registered", "Initialized"), ("Launched",)],
            {"n0": _recorded("n0")},
            {1},
            set(),
        ),
        (
            {PHASE_ANNOTATION: ROLLING_BACK},
            [("Launched", "Registered", "Initialized"), ("Launched",)],
            {"n0": held("n0")},
            {1},
            set(),
        ),
        # registered, not Initialized: its node recorded (the rollback reclaims it) or not
        # seen yet stays; held for the request and not recorded goes through the reclaim's
        # safe path (its pods read live), never deleted here
        (
            {PHASE_ANNOTATION: ROLLING_BACK},
            [("Launched", "Registered"), ("Launched", "Registered")],
            {"n0": _recorded("n0"), "n1": held("n1")},
            set(),
            {1},
        ),
        ({PHASE_ANNOTATION: ROLLING_BACK}, [("Launched", "Registered"), ()], {}, {1}, set()),
        # kept (its source stopped short after every claim launched): kept until it ends
        ({PHASE_ANNOTATION: KEPT}, [("Launched",), ("Launched",)], {}, set(), set()),
        # open: followed, nothing withdrawn
        ({}, [("Launched",), ("Launched",)], {}, set(), set()),
    ],
)
def test_claims_of_an_attempt_rolled_back_are_withdrawn_before_they_arrive(
    notes: dict[str, str],
    states: list[tuple[str, ...]],
    nodes: dict[str, Obj],
    withdrawn: set[int],
    reclaimed: set[int],
) -> None:
    """A rollback takes no new node, and a PodGroup's request stays as the record through
    its backoff (up to 30 minutes): its claims not yet arrived are withdrawn at once, as an
    ended request's are (their nodes would arrive held, unrecorded, idle). Those that
    arrived are left to the rollback (the ledger, the reclaim's safe path). No condition is
    written for what was withdrawn: a claim withdrawn is no claim lost."""
    made = claims()
    for body, conditions in zip(made, states, strict=True):
        index = int(body["metadata"]["annotations"][names.CLAIM_INDEX])
        body["status"] = {
            "conditions": [{"type": c, "status": "True"} for c in conditions],
            "nodeName": f"n{index}" if {"Registered", "Initialized"} & set(conditions) else "",
        }
    live = request(("Accepted", "True", "created 2 NodeClaims in NodePool 'gpu'"))
    live["metadata"]["annotations"] = dict(notes)
    done = served(live, made, nodes=nodes)
    deleted = {int(c["metadata"]["annotations"][names.CLAIM_INDEX]) for c in done.delete}
    assert deleted == withdrawn
    safely = {int(c["metadata"]["annotations"][names.CLAIM_INDEX]) for c in done.reclaim}
    assert safely == reclaimed
    assert done.create == ()
    if notes.get(PHASE_ANNOTATION) == ROLLING_BACK or OUTCOME_ANNOTATION in notes:
        assert done.conditions == ()


def test_a_claim_withdrawn_for_a_rollback_is_not_said_to_be_lost() -> None:
    """The next pass sees the withdrawn claim being deleted: the request rolling back stays
    as it was (no Failed NodeClaimLost), and the claim is not deleted again."""
    made = claims("Launched")
    for body in made:
        body["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:04Z"
    live = request(("Accepted", "True"), ("Provisioned", "True"))
    live["metadata"]["annotations"] = {PHASE_ANNOTATION: ROLLING_BACK}
    assert served(live, made) == Served()


def test_a_claim_gone_after_the_gang_started_does_not_fail_its_request() -> None:
    """After the start the nodes are ordinary Karpenter nodes (consolidation, drift, expiry
    apply): a claim gone then is no partial delivery, and the running gang's request does not
    say it failed."""
    made = claims("Launched", "Registered", "Initialized")[:1]
    live = request(("Accepted", "True"), ("Provisioned", "True"))
    live["metadata"]["annotations"] = {PHASE_ANNOTATION: STARTED}
    assert served(live, made, nodes={"n0": held("n0")}).conditions == ()
    before = request(("Accepted", "True"), ("Provisioned", "True"))
    (failed,) = served(before, made, nodes={"n0": held("n0")}).conditions
    assert failed["reason"] == "NodeClaimLost"  # before the start, a partial delivery


def test_a_claim_deleted_after_it_arrived_is_not_said_to_be_lost_before_arriving() -> None:
    """An arrived claim deleted by hand while the gang waits to start: the request fails (a
    partial delivery now), and what it says is true of a claim gone at any time."""
    made = claims("Launched", "Registered", "Initialized")[1:]
    live = request(("Accepted", "True"), ("Provisioned", "True"))
    (failed,) = served(live, made, nodes={"n1": held("n1")}).conditions
    assert failed["reason"] == "NodeClaimLost"
    assert "before arriving" not in failed["message"]
    assert failed["message"] == (
        "1 of 2 NodeClaims arrived; 1 lost (gone before the gang started: Karpenter deletes a "
        "claim it cannot launch, e.g. InsufficientCapacityError, see the claim's Events; one "
        "deleted by hand or with its NodePool is lost too)"
    )


def test_claims_lost_with_their_nodepool_say_the_pool_is_gone() -> None:
    live = request(("Accepted", "True", "created 2 NodeClaims in NodePool 'gpu'"))
    (failed,) = served(live, [], pools={}).conditions
    assert failed["reason"] == "NodeClaimLost"
    assert failed["message"].endswith("; NodePool 'gpu' was deleted (its NodeClaims go with it)"), (
        failed["message"]
    )


# -- a request made again under the name of one whose claims are still there ---------------


def test_claims_of_an_earlier_request_under_the_same_name_are_not_this_ones() -> None:
    """The gang's request deleted and made again under its name (a PodGroup made again, an
    attempt number used again) before the provisioner saw the first go: the first's claims
    (made before this request was) are not adopted. The one not arrived is withdrawn (no node:
    nothing runs there); the one arrived is left to the reclaim rules; the request is asked
    for anew, under claim names of its own."""
    earlier = claims("Launched", "Registered", "Initialized")
    for claim in earlier:
        claim["metadata"]["creationTimestamp"] = "2026-12-01T09:59:50Z"
    earlier[1]["status"] = {"conditions": [{"type": "Launched", "status": "True"}]}
    again = request()
    again["metadata"]["uid"] = "uid-2"
    done = served(again, earlier, nodes={"n0": held("n0")})
    assert [c["metadata"]["name"] for c in done.delete] == [earlier[1]["metadata"]["name"]]
    assert len(done.create) == 2
    names_before = {c["metadata"]["name"] for c in earlier}
    assert not names_before & {c["metadata"]["name"] for c in done.create}
    assert [(c["type"], c["reason"]) for c in done.conditions] == [
        ("Accepted", "NodeClaimsCreated")
    ]
    assert done.release == ()  # n0 is held: left as it is for the reclaim rules


def test_claims_naming_another_request_uid_are_not_this_ones_even_in_its_second() -> None:
    first = request()
    first["metadata"]["uid"] = "uid-1"
    made = list(served(first, []).create)
    for claim in made:
        claim["metadata"]["creationTimestamp"] = "2026-12-01T10:00:00Z"  # its own second
    assert served(first, made).delete == ()
    again = request()
    again["metadata"]["uid"] = "uid-2"
    done = served(again, made)
    assert len(done.delete) == 2 and len(done.create) == 2


def test_claims_naming_this_request_uid_are_its_own_whatever_second_they_carry() -> None:
    """A claim naming this request's uid (gangcheck.io/request-uid) is its own even when its
    creationTimestamp is in an earlier second than the request's: the time rule is for claims
    naming no uid (made by an older version). Both times come from the API server, but from
    whichever kube-apiserver answered (an HA control plane's clocks a second apart, or one
    stepped back): before, such a claim was taken as an earlier request's, withdrawn before it
    arrived, and the request failed for the claims it had lost."""
    first = request()
    first["metadata"]["uid"] = "uid-1"
    made = list(served(first, []).create)
    for claim in made:
        claim["metadata"]["creationTimestamp"] = "2026-12-01T09:59:59Z"  # another server's clock
    accepted = request(("Accepted", "True", "created 2 NodeClaims in NodePool 'gpu'"))
    accepted["metadata"]["uid"] = "uid-1"
    done = served(accepted, made)
    assert done.delete == () and done.create == ()
    assert not [c for c in done.conditions if c["type"] == "Failed"], done.conditions


def test_a_pool_that_protects_its_nodes_itself_keeps_them_protected_after_the_start() -> None:
    """A NodePool whose template annotates every node karpenter.sh/do-not-disrupt (the
    admin's word, on Karpenter's own nodes of the pool as well): gangcheck's claims carry it
    as Karpenter's would, and the start does not take it off."""
    protecting = pool()
    template_meta = protecting["spec"]["template"]["metadata"]
    template_meta["annotations"] = {names.DO_NOT_DISRUPT: "true"}
    made = claim_bodies(protecting, ClaimAsk(KEY, 2, {GPU: "8"}, LABELS))
    for i, claim in enumerate(made):
        claim["status"] = {
            "conditions": [{"type": c, "status": "True"} for c in ("Launched", "Initialized")],
            "nodeName": f"n{i}",
        }
    assert all(c["metadata"]["annotations"][names.DO_NOT_DISRUPT] == "true" for c in made)
    started = {f"n{i}": held(f"n{i}") for i in range(2)}
    for node in started.values():
        node["spec"]["taints"] = []  # the hold lifted: the gang started
    live = request(("Accepted", "True"), ("Provisioned", "True"))
    assert served(live, made, nodes=started).release == ()
    assert served(None, made, nodes=started).release == ()
    # a pool without it: gangcheck's own protection comes off
    own = claims("Launched", "Initialized")
    assert len(served(live, own, nodes=started).release) == 4


# -- claims made by the previous release (no request uid, no pool-do-not-disrupt) -----------


def old_claims(*conditions: str, pool_obj: Obj | None = None, made: str = "") -> list[Obj]:
    """Claims as the release before gangcheck.io/request-uid made them: named from the attempt
    alone, naming no request uid, no gangcheck.io/pool-do-not-disrupt (the template's
    annotations copied as they are), made in the request's next second at the earliest."""
    bodies = claim_bodies(pool_obj or pool(), ClaimAsk(KEY, 2, {GPU: "8"}, LABELS))
    for i, body in enumerate(bodies):
        body["metadata"]["annotations"].pop(names.POOL_PROTECTED, None)
        body["metadata"]["creationTimestamp"] = made or "2026-12-01T10:00:01Z"
        body["status"] = {
            "conditions": [{"type": c, "status": "True"} for c in conditions],
            "nodeName": f"n{i}" if {"Registered", "Initialized"} & set(conditions) else "",
        }
    return bodies


def live_request(*conditions: tuple[str, ...], started: bool = False) -> Obj:
    req = request(("Accepted", "True", "created 2 NodeClaims in NodePool 'gpu'"), *conditions)
    req["metadata"]["uid"] = "uid-1"
    if started:
        req["metadata"]["annotations"] = {PHASE_ANNOTATION: STARTED}
    return req


@pytest.mark.parametrize(
    ("conditions", "held_nodes", "phase"),
    [
        ((), False, ("Provisioned", "False")),
        (("Launched",), False, ("Provisioned", "True")),
        (("Launched", "Registered", "Initialized"), True, ("Provisioned", "True")),
    ],
    ids=["pending", "launched", "arrived-held"],
)
def test_claims_of_the_previous_release_are_adopted_by_their_request(
    conditions: tuple[str, ...], held_nodes: bool, phase: tuple[str, str]
) -> None:
    """A request asked before the upgrade: its claims (no uid, old names) are its own and
    followed; nothing deleted, nothing asked again."""
    nodes = {f"n{i}": held(f"n{i}") for i in range(2)} if held_nodes else {}
    done = served(live_request(), old_claims(*conditions), nodes=nodes)
    assert done.create == () and done.delete == () and done.release == ()
    assert [(c["type"], c["status"]) for c in done.conditions] == [phase]


def test_claims_of_the_previous_release_made_on_a_clock_behind_are_still_adopted() -> None:
    """An old claim (no uid) whose creationTimestamp is in an earlier second than its request
    (the kube-apiserver that made it a second behind the one that made the request): the
    request recorded them as made (Accepted) and no claim names its uid, so they are its own.
    Before, they were taken as an earlier request's: withdrawn, the request Failed
    NodeClaimLost, the in-flight attempt rolled back by the upgrade."""
    made = old_claims("Launched", made="2026-12-01T09:59:59Z")
    done = served(live_request(), made)
    assert done.create == () and done.delete == ()
    assert [(c["type"], c["status"]) for c in done.conditions] == [("Provisioned", "True")]
    # not yet recorded as made: the time rule stands (an earlier request's, 10056c1)
    fresh = request()
    fresh["metadata"]["uid"] = "uid-1"
    again = served(fresh, made)
    assert len(again.delete) == 2 and len(again.create) == 2


def test_old_claims_of_a_pool_that_protects_its_nodes_keep_the_protection() -> None:
    """Claims the previous release made in a NodePool whose template sets do-not-disrupt carry
    no gangcheck.io/pool-do-not-disrupt: the pool's template says it, so the start (or the
    request gone) does not take the admin's protection off them."""
    protecting = pool()
    protecting["spec"]["template"]["metadata"]["annotations"] = {names.DO_NOT_DISRUPT: "true"}
    made = old_claims("Launched", "Initialized", pool_obj=protecting)
    started = {f"n{i}": held(f"n{i}") for i in range(2)}
    for node in started.values():
        node["spec"]["taints"] = []
    live = live_request(("Provisioned", "True"), started=True)
    assert served(live, made, {"gpu": protecting}, nodes=started).release == ()
    assert served(None, made, {"gpu": protecting}, nodes=started).release == ()
    # a pool that does not: gangcheck's own protection comes off old claims, as before
    assert len(served(live, old_claims("Launched", "Initialized"), nodes=started).release) == 4
    # the pool not read (or gone): nothing says the protection is gangcheck's, it stays
    assert served(None, old_claims("Launched", "Initialized"), {}, nodes=started).release == ()
    fresh = request()
    fresh["metadata"]["uid"] = "uid-1"  # claims made now name it: no pool read for them
    assert reads_pools(made) and not reads_pools(served(fresh, []).create)


def test_an_ended_request_leaves_a_registered_claims_recorded_or_unseen_node() -> None:
    """The ledger may record a node before its claim is Initialized: such a claim is the
    reclaim's (its safe path), as an arrived one is, and one whose node is not seen yet
    waits until it is; a registered node held for the request and not recorded is withdrawn
    through the reclaim's safe path too, the claim's (never deleted on the cached node)."""
    made = claims("Launched", "Registered")
    ended = request(("Accepted", "True"), ("Failed", "True"))
    recorded = {"n0": _recorded("n0"), "n1": held("n1")}
    assert served(ended, made, nodes=recorded).reclaim == (made[1],)
    assert served(ended, made, nodes={"n1": held("n1")}).reclaim == (made[1],)
    both = served(ended, made, nodes={"n0": held("n0"), "n1": held("n1")})
    assert both.reclaim == tuple(made) and both.delete == ()


# -- a withdrawal deletes only claims with no node; one whose node exists goes through the ---
# reclaim's safe path (the pods bound to the node read live, fenced, preconditions).


def _claim_in(state: str) -> Obj:
    """One claim of the attempt as Karpenter leaves it: ``launched`` (providerID, no node
    named), ``registered`` (its node named), ``arrived`` (Initialized), ``requested``."""
    (made,) = claim_bodies(pool(), ClaimAsk(KEY, 1, {GPU: "8"}, LABELS))
    made["metadata"]["creationTimestamp"] = "2026-12-01T10:00:01Z"
    conditions = {
        "requested": (),
        "launched": ("Launched",),
        "registered": ("Launched", "Registered"),
        "arrived": ("Launched", "Registered", "Initialized"),
    }[state]
    made["status"] = {
        "conditions": [{"type": c, "status": "True"} for c in conditions],
        "providerID": "kwok://n0" if conditions else "",
        "nodeName": "n0" if "Registered" in conditions else "",
    }
    return made


def _node(kind: str) -> dict[str, Obj]:
    """The claim's node as the cache has it: ``held`` (registered with the claim's hold, no
    record), ``recorded`` (the ledger's), ``another's`` (held so, recorded for another
    request), ``open`` (its hold lifted), ``marked`` (held, a
    reclaim's mark on it: the draining-node reconciler owes it), ``unlinked`` (registering:
    its providerID, the claim naming no node yet), ``recorded marked`` (recorded, a reclaim
    owed it: draining, failed, or not tried yet), ``recorded open`` (recorded, its hold
    lifted), or none."""
    if kind == "none":
        return {}
    node = _recorded("n0") if kind.startswith("recorded") else held("n0")
    node["spec"]["providerID"] = "kwok://n0"
    if kind.endswith("open"):
        node["spec"]["taints"] = []
    if kind.endswith("marked"):
        node["metadata"]["annotations"]["gangcheck.io/reclaim-when-idle"] = "{}"
    if kind == "another's":
        node["metadata"]["annotations"][ARRIVED_FOR] = "team-a/other-check-1"
    return {"n0": node}


@pytest.mark.parametrize(
    ("state", "node", "rolling_back", "done"),
    [
        # no node: nothing can run there, deleted here (conditional on the claim as read)
        ("requested", "none", False, "delete"),
        ("launched", "none", False, "delete"),
        ("launched", "none", True, "delete"),
        # its node registering (the claim names none yet): waits to be linked
        ("launched", "unlinked", False, "wait"),
        # registered, not Initialized: held and recorded by no one -> the reclaim's safe path
        ("registered", "held", False, "reclaim"),
        ("registered", "held", True, "reclaim"),
        # a reclaim's mark: the draining-node reconciler owes it, not asked twice
        ("registered", "marked", True, "wait"),
        # recorded: the reclaim rules'; hold lifted: pods may run there; not seen: waits
        ("registered", "recorded", True, "wait"),
        # recorded for another request, though it carries this one's hold: that request's
        # (its ledger, its rollback), never recorded over
        ("registered", "another's", False, "wait"),
        ("arrived", "another's", False, "wait"),
        ("registered", "open", False, "wait"),
        ("registered", "none", False, "wait"),
        # arrived: an ended request's unrecorded held node goes the safe way; a rollback's
        # arrived claim is the rollback's to reclaim
        ("arrived", "held", False, "reclaim"),
        ("arrived", "held", True, "wait"),
    ],
)
def test_a_withdrawal_deletes_only_claims_with_no_node(
    state: str, node: str, rolling_back: bool, done: str
) -> None:
    """Before, a Registered (or arrived) claim whose node was held for the request and not
    recorded was deleted here, on the cached node alone: a pod bound there meanwhile (one
    tolerating every taint, or bound by name) went with it. Now every claim whose node exists
    is withdrawn through the reclaim's safe path (``Served.reclaim``), never deleted here."""
    made = [_claim_in(state)]
    if rolling_back:
        req = request(("Accepted", "True", "created 1 NodeClaims in NodePool 'gpu'"))
        req["metadata"]["annotations"] = {PHASE_ANNOTATION: ROLLING_BACK}
    else:
        req = request(("Accepted", "True"), ("Failed", "True"))
    result = served(req, made, nodes=_node(node))
    assert (result.delete, result.reclaim) == {
        "delete": (tuple(made), ()),
        "reclaim": ((), tuple(made)),
        "wait": ((), ()),
    }[done]
    gone = served(None, made, nodes=_node(node))  # the request gone: alike, as ended
    if not rolling_back:
        assert (gone.delete, gone.reclaim) == (result.delete, result.reclaim)


def _in_state(state: str) -> Obj | None:
    """The request in ``state``: ``gone`` (None), ``open`` (asked, followed), ``kept`` (for a
    top-up), ``failed``, ``rolling back``, ``rolled back`` (its outcome recorded, the request
    staying as the record), ``failed, rolled back``, ``deleting``, ``started``."""
    if state == "gone":
        return None
    req = request(("Accepted", "True", "created 1 NodeClaims in NodePool 'gpu'"))
    req["metadata"]["uid"] = "uid-2"
    notes = {
        "kept": {PHASE_ANNOTATION: KEPT},
        "rolling back": {PHASE_ANNOTATION: ROLLING_BACK},
        "rolled back": ROLLED_BACK,
        "failed, rolled back": ROLLED_BACK,
        "started": {PHASE_ANNOTATION: STARTED},
    }.get(state, {})
    req["metadata"]["annotations"] = dict(notes)
    if state.startswith("failed"):
        req["status"]["conditions"].append({"type": "Failed", "status": "True"})
    if state == "deleting":
        req["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:04Z"
    return req


@pytest.mark.parametrize(
    ("state", "claim", "node", "lifted"),
    [
        # kept by a reclaim after the withdrawal's own (it drained, failed, or this process
        # stopped between the mark and the reclaim; the draining-node reconciler kept it):
        # recorded for the request, held, no mark. What lifts the request's holds did so
        # before: lifted here, or never.
        ("gone", "registered", "recorded", True),
        ("gone", "arrived", "recorded", True),
        ("rolled back", "registered", "recorded", True),
        ("rolled back", "arrived", "recorded", True),
        ("failed, rolled back", "registered", "recorded", True),
        ("deleting", "registered", "recorded", True),
        # its rollback still to judge the nodes recorded for it: lifts them once done
        ("failed", "registered", "recorded", False),
        ("rolling back", "registered", "recorded", False),
        ("rolling back", "arrived", "recorded", False),
        # a reclaim still owed it (draining, failed, not tried yet): held until judged
        ("gone", "registered", "recorded marked", False),
        ("rolled back", "arrived", "recorded marked", False),
        # lifted already; another request's record; not recorded (the reclaim's safe path)
        ("gone", "registered", "recorded open", False),
        ("gone", "registered", "another's", False),
        ("gone", "registered", "held", False),
    ],
)
def test_a_node_kept_after_the_withdrawal_has_its_hold_lifted(
    state: str, claim: str, node: str, lifted: bool
) -> None:
    """Before, only the withdrawal's own reclaim lifted the hold of a node it kept: kept
    later by the draining-node reconciler, the node, recorded now, was passed over by every
    later pass and stayed closed to every pod but a dead gang's until consolidation (never,
    with it off). Now a pass lifts it (``Served.lift``) once the request's holds are released
    (gone, deleting, its rollback recorded, started), never while a reclaim is owed it."""
    made = [_claim_in(claim)]
    result = served(_in_state(state), made, nodes=_node(node))
    assert result.lift == (("n0",) if lifted else ())
    assert result.delete == ()
    if node != "held":
        assert result.reclaim == ()


@pytest.mark.parametrize(
    ("state", "ended"),
    [
        ("open", False),
        ("kept", False),
        ("failed", True),
        ("rolling back", True),
        ("rolled back", True),
        ("started", True),
        ("deleting", True),
    ],
)
def test_an_earlier_requests_claim_whose_node_exists_is_withdrawn_once_the_live_one_ends(
    state: str, ended: bool
) -> None:
    """A claim of an earlier request of the same name, registered, its node held (the hold
    is by name: the live request's gang tolerates it, its ledger may record the node) and not
    recorded: never deleted here (before 9d45c03 it was, its node's pods with it). It waits
    while the live request's gang may use the node (open, kept for a top-up), and once that
    request ends for the hold (failed, being deleted, rolling back or rolled back, started)
    it is withdrawn through the reclaim's safe path, as that request's own claims are. Before,
    it waited until the live request was deleted: one Failed, or Started and running for
    days, left the node held and protected from Karpenter's disruption all along. A node of
    it kept by a reclaim has its hold lifted once the live request's holds are released, and
    an arrived one no longer held loses its protection."""
    earlier = _claim_in("registered")
    earlier["metadata"]["creationTimestamp"] = "2026-12-01T09:59:50Z"
    earlier["metadata"]["annotations"][names.REQUEST_UID] = "uid-1"
    live = _in_state(state)
    done = served(live, [earlier], nodes=_node("held"))
    assert done.delete == ()
    assert done.reclaim == ((earlier,) if ended else ())
    assert served(None, [earlier], nodes=_node("held")).reclaim == (earlier,)
    kept = served(live, [earlier], nodes=_node("recorded"))
    released = state in {"rolled back", "started", "deleting"}  # its holds lifted
    assert kept.lift == (("n0",) if released else ()) and kept.reclaim == ()
    arrived = _claim_in("arrived")
    arrived["metadata"]["creationTimestamp"] = "2026-12-01T09:59:50Z"
    arrived["metadata"]["annotations"][names.REQUEST_UID] = "uid-1"
    arrived["metadata"]["annotations"][names.DO_NOT_DISRUPT] = "true"
    opened = _node("recorded open")
    opened["n0"]["metadata"]["annotations"][names.DO_NOT_DISRUPT] = "true"
    assert set(served(live, [arrived], nodes=opened).release) == {
        ("node", "n0"),
        ("claim", arrived["metadata"]["name"]),
    }


def test_an_earlier_requests_claim_with_no_node_is_withdrawn_at_once() -> None:
    """Whatever the live request of the name does, an earlier request's claim with no node
    (none named, none registering) is deleted at once: nothing can run where there is none."""
    earlier = _claim_in("launched")
    earlier["metadata"]["creationTimestamp"] = "2026-12-01T09:59:50Z"
    earlier["metadata"]["annotations"][names.REQUEST_UID] = "uid-1"
    for state in ("open", "kept", "started"):
        done = served(_in_state(state), [earlier])
        assert done.delete == (earlier,) and done.reclaim == ()


def test_a_creation_an_older_release_cut_short_is_completed_under_its_names() -> None:
    """Claims made by a release before request uids (none names one, named from the attempt
    alone), their creation cut short: the missing claim is made under the name that release
    gives it (and, as its claims, naming no uid), so a create of that release still in flight
    meets it (AlreadyExists, taken as made) instead of making a second claim for the slot.
    Before, it was made under the request's uid-based name: both could exist. Claims are
    counted by the attempt's label and annotation, whatever their names (``attempt_claims``):
    only the missing index is made. A creation of this release is completed under uid-based
    names, as before."""
    fresh = request()
    fresh["metadata"]["uid"] = "uid-1"
    old = asked("Launched")[:1]  # the request named no uid for them: the older release's
    old[0]["metadata"]["creationTimestamp"] = "2026-12-01T10:00:01Z"
    done = serve(
        fresh, KEY, templates=TEMPLATES, claims=old, pools={"gpu": pool()}, nodes={}, now=NOW
    )
    (made,) = done.create
    assert made["metadata"]["name"] == claim_name("gpu", KEY, 1)
    assert names.REQUEST_UID not in made["metadata"]["annotations"]
    assert [(c["type"], c["reason"]) for c in done.conditions] == [
        ("Accepted", "NodeClaimsCompleted")
    ]
    own = [
        dict(c)
        for c in serve(
            fresh, KEY, templates=TEMPLATES, claims=[], pools={"gpu": pool()}, nodes={}, now=NOW
        ).create
    ][:1]
    again = serve(
        fresh, KEY, templates=TEMPLATES, claims=own, pools={"gpu": pool()}, nodes={}, now=NOW
    )
    (remade,) = again.create
    assert remade["metadata"]["name"] == claim_name("gpu", KEY, 1, "uid-1")
    assert remade["metadata"]["annotations"][names.REQUEST_UID] == "uid-1"


@pytest.mark.parametrize(
    ("recorded", "state", "node", "done"),
    [
        # made and never recorded (Accepted not written: a create's answer lost, a restart
        # between the create and the record), the gang started without it
        (False, "requested", "none", "delete"),
        (False, "launched", "none", "delete"),
        (False, "launched", "unlinked", "wait"),  # registering: judged once linked
        (False, "registered", "held", "reclaim"),  # its pods read live: surplus if none
        (False, "arrived", "held", "reclaim"),
        (False, "registered", "marked", "wait"),  # a reclaim owed it already
        (False, "registered", "recorded", "wait"),  # the reclaim rules'
        (False, "registered", "open", "wait"),  # not held: pods may run there
        (False, "registered", "another's", "wait"),
        (False, "registered", "none", "wait"),  # not seen yet
        # recorded as made: one still launching, or whose held node the ledger never took
        (True, "launched", "none", "delete"),
        (True, "arrived", "held", "reclaim"),
        (True, "arrived", "recorded", "wait"),
        (True, "arrived", "open", "wait"),
    ],
)
def test_claims_of_a_started_gang_it_does_not_run_on_are_withdrawn(
    recorded: bool, state: str, node: str, done: str
) -> None:
    """Once the gang started (every member scheduled), a claim of its attempt with no node
    is surplus (nothing can run where there is none), and one whose node is held for the
    request and recorded by no one holds none of the gang's pods, unless the scheduler put
    one there (the gang tolerates its hold): the reclaim's safe path reads them live and
    deletes the claim only if none but DaemonSet pods are there. Before, a started request's
    claims were all left as they were: such a node stayed held for the gang and protected
    from Karpenter's disruption (do-not-disrupt comes off only once it is not held) for as
    long as the request lived, a machine nobody could use."""
    made = [_claim_in(state)]
    started = _in_state("started")
    assert started is not None
    if not recorded:
        started["status"]["conditions"] = []
    result = served(started, made, nodes=_node(node))
    assert (result.delete, result.reclaim) == {
        "delete": (tuple(made), ()),
        "reclaim": ((), tuple(made)),
        "wait": ((), ()),
    }[done]
    assert result.conditions == () and result.create == ()
