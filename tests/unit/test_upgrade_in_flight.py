"""Upgrading with gangs in flight from the release before today's changes: the objects that
release wrote, shaped as it writes them, and what this one decides on them. Nothing an old
attempt in flight asked for is withdrawn, reclaimed, asked for twice or decremented twice
(docs/install.md, "Upgrading").

- DeleteMachine: that release recorded a decrement as one single-valued annotation on the
  owner (``gangcheck.io/scaled-down-for-machine: <Machine uid>``), this one a key per Machine.
  A reclaim it cut short between the decrement and the Machine's mark is finished without a
  second decrement, whatever other Machines of the owner this one scales down meanwhile.
- A PodGroup's gang and growth follow the start deadline of the config now (it judged them by
  the one they were made under): a gang all bound when the new leader first looks is started
  (``gangcheck.io/phase: Started``, as that release writes it), not rolled back, even when the
  config was shortened below the time since its release.
- Karpenter: a withdrawal that release began (some claims already being deleted) is taken up
  claim by claim: only a claim with no node is deleted here.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gangcheck.kube.resources import MACHINE, MACHINE_SET, NODE
from gangcheck.logic.attempt import lifecycle
from gangcheck.logic.attempt.actions import AnnotateRequest
from gangcheck.logic.podgroups import growth
from gangcheck.logic.timefmt import format_time
from gangcheck.model.names import ARRIVED_FOR, OWNER_SCALED_DOWN, PHASE_ANNOTATION
from gangcheck.model.objects import request_of
from gangcheck.model.provisioning_config import parse_spec, spec_record
from gangcheck.reclaim.reclaimers import DELETE_MACHINE_ANNOTATION, NOT_CACHED, DeleteMachine
from tests.fakes.kube import FakeKube
from tests.unit import test_karpenter_provisioner as kp
from tests.unit import test_podgroup_decide as pg
from tests.unit import test_podgroup_growth as grown

Obj = dict[str, Any]
NS = "capi"
OLD_RECORD = "gangcheck.io/scaled-down-for-machine"
"""The owner's record of a decrement as the previous release writes it: one key, its value
the uid of the Machine decremented for (overwritten by the next)."""


def capi(
    replicas: int, owner_notes: dict[str, str], machines: dict[str, dict[str, str]]
) -> FakeKube:
    """A MachineSet of `replicas` with the annotations `owner_notes`, and per Machine name its
    annotations and its Node (``node-<name>``), as Cluster API links them."""
    kube = FakeKube()
    kube.add(
        {
            "apiVersion": "cluster.x-k8s.io/v1beta1",
            "kind": "MachineSet",
            "metadata": {
                "name": "ms",
                "namespace": NS,
                "uid": "ms-uid",
                "annotations": owner_notes,
            },
            "spec": {"replicas": replicas},
        }
    )
    for name, notes in machines.items():
        owner = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineSet", "name": "ms"}
        kube.add(
            {
                "apiVersion": "cluster.x-k8s.io/v1beta1",
                "kind": "Machine",
                "metadata": {
                    "name": name,
                    "namespace": NS,
                    "uid": f"uid-{name}",
                    "annotations": notes,
                    "ownerReferences": [{**owner, "uid": "ms-uid", "controller": True}],
                },
                "status": {"nodeRef": {"name": f"node-{name}"}},
            },
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": f"node-{name}",
                    "annotations": {
                        "cluster.x-k8s.io/machine": name,
                        "cluster.x-k8s.io/cluster-namespace": NS,
                    },
                },
            },
        )
    return kube


CUT_SHORT = {DELETE_MACHINE_ANNOTATION: "true"}
"""A Machine whose reclaim the previous release cut short after the owner's decrement: marked
for deletion, not yet saying its owner was scaled down."""
FINISHED = {DELETE_MACHINE_ANNOTATION: "true", OWNER_SCALED_DOWN: "MachineSet/ms"}


@pytest.mark.parametrize(
    ("machines", "reclaimed", "replicas"),
    [
        # the cut-short reclaim retried: its decrement is done, not made again
        ({"a": CUT_SHORT}, ["a"], 2),
        # another Machine of the owner scaled down first (by this release), then the retry:
        # one decrement for each, the old record not overwritten
        ({"a": CUT_SHORT, "b": {}}, ["b", "a"], 1),
        ({"a": CUT_SHORT, "b": {}}, ["a", "b"], 1),
        # the old record names a Machine whose reclaim finished: another is decremented for
        ({"a": FINISHED, "b": {}}, ["b"], 1),
    ],
    ids=["retried", "another-first", "another-after", "old-record-done"],
)
async def test_a_decrement_the_previous_release_recorded_is_not_made_again(
    machines: dict[str, dict[str, str]], reclaimed: list[str], replicas: int
) -> None:
    """The previous release decremented the owner for Machine a (3 -> 2) and recorded it
    single-valued, then lost its lease before marking the Machine."""
    kube = capi(2, {OLD_RECORD: "uid-a"}, machines)
    for name in reclaimed:
        await DeleteMachine().reclaim(kube, await kube.get(NODE, f"node-{name}"), NOT_CACHED)
    owner = kube.stored(MACHINE_SET, "ms", NS)
    assert owner is not None
    assert owner["spec"]["replicas"] == replicas
    for name in reclaimed:
        machine = kube.stored(MACHINE, name, NS)
        assert machine is not None
        assert machine["metadata"]["annotations"][OWNER_SCALED_DOWN] == "MachineSet/ms"
    # the new per-Machine records are taken off once their Machine is marked; the old one is
    # left as it was (read, never rewritten)
    notes = owner["metadata"]["annotations"]
    assert notes == {OLD_RECORD: "uid-a"}


# -- a PodGroup's gang and growth: the start deadline of the config now ---------------------


def made_under(seconds: int) -> dict[str, str]:
    """The previous release's record of the config an attempt was made under."""
    spec = parse_spec({"fulfillment": {"startDeadlineSeconds": seconds}})
    return {"gangcheck.io/attempt-config": spec_record(spec)}


SHORTENED = {"fulfillment": {"startDeadlineSeconds": 250}}
"""The config edited before the upgrade: below the time since the release (660 s for the
gang, 601 s for the growth), where the attempt was made under 900 s."""


def _phases(actions: Any) -> list[str]:
    return [
        a.annotations[PHASE_ANNOTATION]
        for a in actions
        if isinstance(a, AnnotateRequest) and PHASE_ANNOTATION in a.annotations
    ]


def test_a_gang_all_bound_is_started_not_rolled_back_by_a_start_deadline_shortened() -> None:
    """Its members all bound before the upgrade, its Started not yet recorded (the previous
    leader stopped first): started, whatever the config now says of the start deadline."""
    bound = [pg.consuming(0, node_name="n1"), pg.consuming(1, node_name="n1")]
    decision = pg._watchdog(pg.RELEASED, bound, made_under(900), config=SHORTENED)
    assert _phases(decision.actions) == ["Started"]


def test_a_gang_recorded_started_is_never_judged_by_the_start_deadline_again() -> None:
    decision = pg._watchdog(
        pg.RELEASED,
        [pg.consuming(0, node_name="n1"), pg.consuming(1)],
        {**made_under(900), PHASE_ANNOTATION: "Started"},
        config=SHORTENED,
    )
    assert _phases(decision.actions) == []


def test_a_gang_still_binding_past_the_shortened_deadline_is_rolled_back_as_intended() -> None:
    """The intended change (docs/configure.md): the config now applies, so a gang whose
    members are not all bound when the new leader looks, released longer ago than the edited
    startDeadlineSeconds, is rolled back at once."""
    binding = [pg.consuming(0, node_name="n1"), pg.consuming(1)]
    decision = pg._watchdog(pg.RELEASED, binding, made_under(900), config=SHORTENED)
    assert _phases(decision.actions) == ["RollingBack"]


def test_a_growth_all_bound_is_started_not_rolled_back_by_a_start_deadline_shortened() -> None:
    decision = grown.watched(
        annotations={**grown.DELIVERED, **made_under(900)},
        now=datetime(2026, 11, 30, 10, 14, 1, tzinfo=UTC),
        members=[*grown.running(), *grown.binding("new0", "new1")],
        config=SHORTENED,
    )
    assert _phases(decision.actions) == ["Started"]


# -- Karpenter: a withdrawal the previous release began ---------------------------------------


def test_a_withdrawal_the_previous_release_began_deletes_only_the_claims_with_no_node() -> None:
    """An ended request's four claims (the previous release makes the same claims, under the
    same names): one it was deleting already, one with no node, one whose node is held and
    recorded by no one, one whose node the ledger recorded. The one being deleted is left to
    finish, the node-less one deleted, the held one withdrawn through the reclaim's safe path
    (the previous release deleted it at once), the recorded one left to the reclaim rules."""
    deleting, nodeless, held, recorded = (
        kp._claim_in("registered"),
        kp._claim_in("launched"),
        kp._claim_in("registered"),
        kp._claim_in("arrived"),
    )
    for i, claim in enumerate((deleting, nodeless, held, recorded)):
        claim["metadata"]["name"] += f"-{i}"
        claim["status"]["providerID"] = f"kwok://n{i}" if claim["status"]["providerID"] else ""
        claim["status"]["nodeName"] = f"n{i}" if claim["status"]["nodeName"] else ""
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:04Z"
    nodes = {"n0": kp.held("n0"), "n2": kp.held("n2"), "n3": kp.held("n3")}
    nodes["n3"]["metadata"]["annotations"][ARRIVED_FOR] = kp.KEY
    for name, node in nodes.items():
        node["spec"]["providerID"] = f"kwok://{name}"
    ended = kp.request(("Accepted", "True"), ("Failed", "True"))
    done = kp.served(ended, [deleting, nodeless, held, recorded], nodes=nodes)
    assert done.delete == (nodeless,)
    assert done.reclaim == (held,)
    assert done.create == ()


@pytest.mark.parametrize(
    ("made", "now"), [(250, 86400), (250, 900), (900, 250)], ids=["raised-a-day", "raised", "cut"]
)
def test_the_growth_after_one_the_previous_release_rolled_back_on_start_is_due_as_it_was(
    made: int, now: int
) -> None:
    """A growth that release's start watchdog rolled back (no
    ``gangcheck.io/start-rolled-back-at``: that release writes none) was rolled back at its
    release plus the startDeadlineSeconds it was made under, which that release judged it by:
    the next growth is due a backoff after that, whatever startDeadlineSeconds became since
    (raising it is the natural answer to start rollbacks; from a day's wait to none at all
    otherwise)."""
    released = datetime(2026, 11, 30, 10, 4, tzinfo=UTC)
    req = request_of(
        grown.grow_req(
            annotations={
                **grown.START_ROLLED,
                **made_under(made),
                "gangcheck.io/fulfillment-deadline": "2026-11-30T10:07:00Z",
                "gangcheck.io/released-at": format_time(released),
            }
        )
    )
    config = parse_spec({"fulfillment": {"startDeadlineSeconds": now}})
    backoff = lifecycle.backoff_seconds(1, config.retry_strategy)
    rolled_back = released + timedelta(seconds=made)
    assert growth.next_due(config, 1, req) == rolled_back + timedelta(seconds=backoff)
