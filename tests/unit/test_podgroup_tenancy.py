"""Which namespaces' PodGroups may use an AtomicProvisioningConfig: its
spec.podGroups.namespaceSelector (the model, the matching, the config a group gets), and the
provisioner following it: a group in a namespace not selected is Blocked, nothing asked; an
attempt already in flight goes on under the config it recorded."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from gangcheck.app import Controller
from gangcheck.kube.informer import Informer
from gangcheck.kube.resources import ATOMIC_CONFIG, NAMESPACE, NODE, POD
from gangcheck.logic.attempt.explain import World as ExplainWorld
from gangcheck.logic.attempt.hold import HOLD_TAINT
from gangcheck.logic.podgroups.group_diagnosis import gather_group, group_verdict
from gangcheck.logic.podgroups.group_snapshot import config_serving, selects
from gangcheck.model.names import CONFIG_ANNOTATION, MESSAGE_ANNOTATION, STATE_ANNOTATION
from gangcheck.model.objects import pod_of
from gangcheck.model.provisioning_config import LabelSelector, parse_spec, spec_record
from tests.fakes.kube import FakeKube
from tests.unit import test_group_diagnosis as diagnosis
from tests.unit.test_podgroup_reconciler import GROUPS, World, gang, namespace, pod_group

Obj = dict[str, Any]
NOT_SERVED = (
    "AtomicProvisioningConfig 'team-a' does not serve namespace 'default' "
    "(spec.podGroups.namespaceSelector)"
)


def selector(**raw: Any) -> LabelSelector:
    return LabelSelector.model_validate(raw)


def expression(key: str, operator: str, *values: str) -> Obj:
    return (
        {"key": key, "operator": operator, "values": list(values)}
        if values
        else {
            "key": key,
            "operator": operator,
        }
    )


# ---- the matching ---------------------------------------------------------------------------

SELECTS = [
    pytest.param(None, {}, True, id="no selector selects every namespace, one without labels too"),
    pytest.param(selector(), {"team": "a"}, True, id="an empty selector selects every namespace"),
    pytest.param(selector(matchLabels={"team": "a"}), {"team": "a"}, True, id="matchLabels held"),
    pytest.param(
        selector(matchLabels={"team": "a"}), {"team": "b"}, False, id="matchLabels other value"
    ),
    pytest.param(selector(matchLabels={"team": "a"}), {}, False, id="matchLabels label absent"),
    pytest.param(
        selector(matchLabels={"team": "a", "tier": "gpu"}),
        {"team": "a"},
        False,
        id="every matchLabels pair must hold",
    ),
    pytest.param(
        selector(matchExpressions=[expression("team", "In", "a", "b")]),
        {"team": "b"},
        True,
        id="In: one of the values",
    ),
    pytest.param(
        selector(matchExpressions=[expression("team", "In", "a")]),
        {},
        False,
        id="In: label absent",
    ),
    pytest.param(
        selector(matchExpressions=[expression("team", "NotIn", "a")]),
        {"team": "b"},
        True,
        id="NotIn: another value",
    ),
    pytest.param(
        selector(matchExpressions=[expression("team", "NotIn", "a")]),
        {},
        True,
        id="NotIn holds for a label absent (as Kubernetes)",
    ),
    pytest.param(
        selector(matchExpressions=[expression("team", "NotIn", "a")]),
        {"team": "a"},
        False,
        id="NotIn: the value",
    ),
    pytest.param(
        selector(matchExpressions=[expression("team", "Exists")]),
        {"team": ""},
        True,
        id="Exists: an empty value exists",
    ),
    pytest.param(
        selector(matchExpressions=[expression("team", "Exists")]), {}, False, id="Exists: absent"
    ),
    pytest.param(
        selector(matchExpressions=[expression("team", "DoesNotExist")]),
        {"other": "x"},
        True,
        id="DoesNotExist: absent",
    ),
    pytest.param(
        selector(matchExpressions=[expression("team", "DoesNotExist")]),
        {"team": "a"},
        False,
        id="DoesNotExist: present",
    ),
    pytest.param(
        selector(
            matchLabels={"team": "a"}, matchExpressions=[expression("sandbox", "DoesNotExist")]
        ),
        {"team": "a", "sandbox": "yes"},
        False,
        id="matchLabels and matchExpressions must all hold",
    ),
]


@pytest.mark.parametrize(("chosen", "labels", "selected"), SELECTS)
def test_selects(chosen: LabelSelector | None, labels: dict[str, str], selected: bool) -> None:
    assert selects(chosen, labels) is selected


# ---- the model --------------------------------------------------------------------------------

BAD = [
    pytest.param(
        {"matchExpressions": [expression("team", "In")]},
        "spec.podGroups.namespaceSelector.matchExpressions[0]: values: required with operator In",
        id="In without values",
    ),
    pytest.param(
        {"matchExpressions": [expression("team", "Exists", "a")]},
        "spec.podGroups.namespaceSelector.matchExpressions[0]: values: not with operator Exists",
        id="Exists with values",
    ),
    pytest.param(
        {"matchExpressions": [expression("team", "Gt", "1")]},
        "spec.podGroups.namespaceSelector.matchExpressions[0].operator: Input should be 'In', "
        "'NotIn', 'Exists' or 'DoesNotExist'",
        id="a node selector's operator is not a label selector's",
    ),
    pytest.param(
        {"matchLabels": {"team a": "x"}},
        "'team a' is not a label key",
        id="a matchLabels key that is no label key",
    ),
    pytest.param(
        {"matchLabels": {"team": "-a"}},
        "'-a' is not a label value",
        id="a matchLabels value that is no label value",
    ),
    pytest.param(
        {"matchExpressions": [expression("Example.com/team", "Exists")]},
        "'Example.com/team' has no valid prefix",
        id="a prefix not in lower case",
    ),
    pytest.param(
        {"matchExpressions": [expression("team", "In", "x" * 64)]},
        "is not a label value",
        id="a value past 63 characters",
    ),
    pytest.param({"matchLabel": {"team": "a"}}, "Extra inputs", id="a field misspelt"),
]


@pytest.mark.parametrize(("raw", "said"), BAD)
def test_a_bad_namespace_selector_makes_the_config_invalid_saying_why(raw: Obj, said: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_spec({"podGroups": {"namespaceSelector": raw}})
    assert said in str(caught.value)


def test_a_good_namespace_selector_is_read() -> None:
    spec = parse_spec(
        {
            "podGroups": {
                "namespaceSelector": {
                    "matchLabels": {"example.com/team": "a"},
                    "matchExpressions": [
                        expression("tier", "In", "gpu", ""),
                        expression("x", "Exists"),
                    ],
                }
            }
        }
    )
    found = spec.pod_groups.namespace_selector
    assert found is not None
    assert found.match_labels == {"example.com/team": "a"}
    assert [r.values for r in found.match_expressions] == [("gpu", ""), ()]


def test_an_attempts_record_leaves_the_namespace_selector_out() -> None:
    """Who may start an attempt is nothing the attempt needs to finish; a record without it
    reads in a version that predates the field."""
    spec = parse_spec({"podGroups": {"namespaceSelector": {"matchLabels": {"team": "a"}}}})
    assert spec_record(spec) == "{}"


# ---- the config a group gets -----------------------------------------------------------------


def config(name: str, namespace_selector: Obj | None = None) -> Obj:
    spec: Obj = {"fulfillment": {"reclaimer": "DeleteNode"}}
    if namespace_selector is not None:
        spec["podGroups"] = {"namespaceSelector": namespace_selector}
    return {
        "apiVersion": ATOMIC_CONFIG.api_version,
        "kind": "AtomicProvisioningConfig",
        "metadata": {"name": name},
        "spec": spec,
    }


CONFIGS = {
    "everyone": config("everyone"),
    "everyone-too": config("everyone-too", {}),
    "team-a": config("team-a", {"matchLabels": {"team": "a"}}),
    "broken": config("broken", {"matchExpressions": [expression("team", "In")]}),
}

SERVING = [
    pytest.param("everyone", {}, "", id="a config without a selector serves every namespace"),
    pytest.param("everyone-too", {}, "", id="an empty selector serves every namespace"),
    pytest.param("team-a", {"team": "a"}, "", id="a selected namespace is served"),
    pytest.param("team-a", {"team": "b"}, NOT_SERVED, id="a namespace not selected is refused"),
    pytest.param("team-a", None, "", id="labels not read: the selector is not applied"),
    pytest.param(
        "gone",
        {"team": "a"},
        "AtomicProvisioningConfig 'gone' not found",
        id="a config that does not exist is said as before",
    ),
    pytest.param(
        "broken",
        {"team": "a"},
        "AtomicProvisioningConfig 'broken': spec.podGroups.namespaceSelector.matchExpressions[0]"
        ": values: required with operator In",
        id="an invalid selector makes the config invalid, for every namespace",
    ),
    pytest.param("", {"team": "b"}, "", id="the built-in defaults (no config named) serve all"),
]


@pytest.mark.parametrize(("name", "labels", "problem"), SERVING)
def test_the_config_a_group_gets(name: str, labels: dict[str, str] | None, problem: str) -> None:
    spec, why = config_serving(name, CONFIGS.get, namespace="default", labels=labels)
    assert why == problem
    assert (spec is None) is bool(problem)


# ---- the provisioner ---------------------------------------------------------------------------


def named(config_name: str) -> Obj:
    group = pod_group()
    group["metadata"]["annotations"] = {CONFIG_ANNOTATION: config_name}
    return group


def labelled(world: World, **labels: str) -> None:
    ns = namespace()
    ns["metadata"]["labels"] |= labels
    world.kube.add(ns)


def with_selector(world: World, namespace_selector: Obj) -> None:
    world.kube.add(config("team-a", namespace_selector))


async def test_a_group_in_a_namespace_not_selected_is_blocked_and_asks_nothing() -> None:
    world = World(CONFIGS["team-a"], named("team-a"), *gang()[1:])
    await world.settle()
    says = world.group_says()
    assert (says[STATE_ANNOTATION], says[MESSAGE_ANNOTATION]) == ("Blocked", NOT_SERVED)
    events = [(w.body["reason"], w.body["message"]) for w in world.kube.writes_of("Event")]
    assert events == [("ConfigProblem", NOT_SERVED)]
    assert world.requests() == []
    assert world.gated() == ["m0", "m1", "m2"]
    # the namespace labelled for the config: asked for
    labelled(world, team="a")
    await world.settle()
    (req,) = world.requests()
    assert req["spec"]["podSets"][0]["count"] == 3
    assert world.group_says()[STATE_ANNOTATION] == "Provisioning"


async def test_the_default_config_follows_its_selector_too() -> None:
    world = World(CONFIGS["team-a"], *gang())
    world.reconciler._options = type(world.reconciler._options)(config="team-a")
    await world.settle()
    assert world.group_says()[MESSAGE_ANNOTATION] == NOT_SERVED
    assert world.requests() == []


async def test_an_attempt_in_flight_goes_on_under_its_config_once_the_namespace_is_not_served() -> (
    None
):
    world = World(CONFIGS["team-a"], named("team-a"), *gang()[1:])
    labelled(world, team="a")
    await world.settle()
    (req,) = world.requests()
    labelled(world, team="b")  # relabelled mid-attempt
    await world.settle()
    assert [r["metadata"]["name"] for r in world.requests()] == [req["metadata"]["name"]]
    assert world.group_says()[STATE_ANNOTATION] == "Provisioning"
    world.provision("n1", "n2")
    await world.settle()
    assert world.gated() == []  # released on what was asked: nothing provisioned is lost
    assert world.group_says()[STATE_ANNOTATION] == "Released"


async def test_a_released_group_is_left_running_when_its_config_stops_serving_the_namespace() -> (
    None
):
    world = World(CONFIGS["team-a"], named("team-a"), *gang()[1:])
    labelled(world, team="a")
    await world.settle()
    world.provision("n1", "n2")
    await world.settle()
    writes = len(world.kube.writes)
    with_selector(world, {"matchLabels": {"team": "b"}})
    world.now += timedelta(seconds=5)
    await world.settle()
    assert world.group_says()[STATE_ANNOTATION] == "Released"
    assert world.kube.writes[writes:] == []  # nothing running touched, nothing written


# ---- the controller: a namespace relabelled is read again --------------------------------------


async def test_a_namespace_relabelled_requeues_its_groups_and_only_then() -> None:
    kube = FakeKube()
    kube.add(namespace(), pod_group())
    controller = Controller(kube)
    controller.caches.pod_groups[GROUPS.group] = Informer(kube, GROUPS)
    kube.sync(controller.caches)
    old = kube.stored(NAMESPACE, "default")
    assert old is not None
    new = {**old, "metadata": {**old["metadata"], "labels": {**old["metadata"]["labels"]}}}
    new["metadata"]["annotations"] = {"note": "x"}
    controller._on_namespace(old, new)
    assert len(controller.queue) == 0  # labels unchanged: nothing to decide again
    new["metadata"]["labels"]["team"] = "a"
    controller._on_namespace(old, new)
    assert await controller.queue.get() == "pg:pg/default/g"
    controller.queue.done("pg:pg/default/g")
    controller._on_namespace(None, new)  # newly cached: a group seen before it is read again
    assert len(controller.queue) == 1


# ---- gangcheck diagnose: the same reason, from its one live read --------------------------------


@pytest.mark.parametrize(
    ("labels", "state", "message"),
    [
        pytest.param({"team": "b"}, "Blocked", NOT_SERVED, id="not selected: Blocked, the reason"),
        pytest.param({"team": "a"}, "Provisioning", "", id="selected: the gang is asked for"),
    ],
)
def test_diagnose_replays_the_namespace_selector(
    labels: dict[str, str], state: str, message: str
) -> None:
    obj = diagnosis.group(3, state="WaitingForMembers")
    obj["metadata"]["annotations"][CONFIG_ANNOTATION] = "team-a"
    pods = diagnosis.members(3, creationTimestamp="2026-11-30T10:00:00Z")
    world = ExplainWorld(pods=tuple(pods), configs={"team-a": CONFIGS["team-a"]})
    facts = gather_group(
        obj,
        [pod_of(p) for p in pods],
        world,
        namespace="default",
        name="g",
        opted_in=True,
        namespace_labels=labels,
        now=diagnosis.NOW,
    )
    assert facts.replay is not None
    assert facts.replay.state == state
    if message:
        assert facts.replay.message == message
        assert group_verdict(facts, diagnosis.NOW).line == f"blocked: Blocked: {NOT_SERVED}"
    else:
        assert facts.replay.asks


async def test_a_group_seen_before_its_namespace_waits_for_it_saying_nothing() -> None:
    """A namespace made with its group (a pipeline applying both): the group's watch event
    may come before the namespace's. Its labels are not known then: the group is neither
    asked for (the selector not applied) nor said Blocked (no ConfigProblem Event for a
    namespace the config does serve); it is looked at again shortly, and once the
    namespace is cached, asked for."""
    world = World(CONFIGS["team-a"], named("team-a"), *gang()[1:])
    world.kube.remove(NAMESPACE, "default")
    result = await world.reconcile()
    assert result.requeue_after is not None and result.requeue_after > 0
    assert world.kube.writes == []
    assert world.requests() == []
    labelled(world, team="a")
    await world.settle()
    (req,) = world.requests()
    assert req["spec"]["podSets"][0]["count"] == 3
    reasons = [w.body["reason"] for w in world.kube.writes_of("Event")]
    assert "ProvisioningRequestCreated" in reasons
    assert "ConfigProblem" not in reasons, reasons


async def test_a_group_being_deleted_is_followed_without_its_namespace() -> None:
    """The namespace gone from the cache before its group (a namespace deleted): the group's
    deletion still withdraws its requests, the namespace not waited for."""
    world = World(CONFIGS["team-a"], named("team-a"), *gang()[1:])
    labelled(world, team="a")
    await world.settle()
    assert len(world.requests()) == 1
    world.kube.remove(NAMESPACE, "default")
    group = world.kube.stored(GROUPS, "g", "default")
    assert group is not None
    group["metadata"]["deletionTimestamp"] = "2026-11-30T10:00:00Z"
    group["metadata"]["finalizers"] = ["example.com/keep"]
    world.kube.add(group)
    await world.settle()
    assert world.requests() == []


async def test_a_member_gone_mid_attempt_once_not_served_withdraws_the_attempt() -> None:
    """Relabelled mid-attempt, then a member deleted (2 of 3 left): served, the group would
    wait for members with its request withdrawn and its hold lifted; not served it did
    neither: Blocked, the request kept as it was, holding what arrived for a gang that
    cannot start, for as long as the namespace stays unserved. Now Blocked with the request
    withdrawn, as when served."""
    world = World(CONFIGS["team-a"], named("team-a"), *gang()[1:])
    labelled(world, team="a")
    await world.settle()
    world.provision("n1")  # room for 2 of the 3: recorded for the request and held
    await world.settle()
    assert held("n1", world)
    labelled(world, team="b")
    world.kube.remove(POD, "m2", "default")
    await world.settle()
    says = world.group_says()
    assert (says[STATE_ANNOTATION], says[MESSAGE_ANNOTATION]) == ("Blocked", NOT_SERVED)
    assert world.requests() == []
    assert not held("n1", world)  # free for others again
    assert world.gated() == ["m0", "m1"]


def held(name: str, world: World) -> bool:
    stored = world.kube.stored(NODE, name)
    assert stored is not None
    return any(t["key"] == HOLD_TAINT for t in stored["spec"].get("taints") or [])
