"""The simulated cloud's decisions: rules, sizing, plans and what is due when."""

from __future__ import annotations

import random
from typing import Any

import pytest
from gangcheck_dev.simcloud import model
from gangcheck_dev.simcloud.model import (
    Member,
    NodeGroup,
    Outcome,
    PodSetDemand,
    Scenario,
    Sizing,
    parse_config,
)

GPU_GROUP = NodeGroup(
    name="gpu",
    max_nodes=16,
    cpu="32",
    memory="256Gi",
    gpus=8,
    labels={"pool": "gpu"},
    taints=(model.Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule"),),
)
CPU_GROUP = NodeGroup(name="cpu", max_nodes=4, cpu="8", memory="32Gi", labels={"pool": "cpu"})
TOLERATE_GPU = ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)


def template(*, cpu: str = "1", gpu: int = 0, **spec: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu}}
    if gpu:
        resources["limits"] = {model.GPU: str(gpu)}
    return {"template": {"spec": {"containers": [{"name": "c", "resources": resources}], **spec}}}


def gpu_member(gpus: int = 8) -> Member:
    return model.member_of(
        template(gpu=gpus, nodeSelector={"pool": "gpu"}, tolerations=list(TOLERATE_GPU))
    )


def plan_for(scenario: Scenario, sizing: Sizing, *, no_retry: bool = False) -> model.Plan:
    return model.build_plan(
        scenario,
        sizing,
        groups=[GPU_GROUP, CPU_GROUP],
        started_at=1000.0,
        no_retry=no_retry,
        rng=random.Random(1),
    )


# --- config and rules ----------------------------------------------------------------------


def test_config_reads_yaml_with_camel_case_and_defaults() -> None:
    config = parse_config(
        """
        nodeGroups: [{name: gpu, maxNodes: 4, gpus: 8, taints: [{key: k, effect: NoSchedule}]}]
        scenarios: [{match: {name: "stock-.*"}, stockout: true, nodeDelaySeconds: [1, 2]}]
        """
    )
    assert config.provisioning_class_names == ("best-effort-atomic-scale-up.autoscaling.x-k8s.io",)
    assert config.node_groups[0].capacity() == {
        "cpu": "8",
        "memory": "32Gi",
        "pods": "110",
        model.GPU: "8",
    }
    assert [config.scenarios[0].node_delay(i) for i in range(3)] == [1, 2, 2]


@pytest.mark.parametrize(
    "text",
    [
        "nodeGroups: [{name: a, maxNode: 3}]",
        "nodeGroups: [{name: a, cpu: lots}]",
        "nodeGroups: [{name: a}, {name: a}]",
        "scenarios: [{match: {name: '('}}]",
        "- just a list",
    ],
    ids=["typo", "bad quantity", "duplicate group", "bad regex", "not a mapping"],
)
def test_config_refuses_mistakes(text: str) -> None:
    with pytest.raises(ValueError):
        parse_config(text)


def test_first_fitting_rule_wins_and_times_falls_through() -> None:
    config = parse_config(
        """
        scenarios:
          - {name: once, match: {namespace: a}, times: 1, stockout: true}
          - {name: late, match: {name: "job-.*"}, failAfterSeconds: 5}
        """
    )
    key, first = model.choose_scenario(config, namespace="a", name="job-1", uses={})
    assert first.name == "once"
    assert key is not None
    _, second = model.choose_scenario(config, namespace="a", name="job-1", uses={key: 1})
    assert second.name == "late"
    _, other = model.choose_scenario(config, namespace="b", name="x-job-1", uses={})
    assert other is model.DEFAULT_SCENARIO


# --- sizing --------------------------------------------------------------------------------


def test_members_per_node_is_the_scarcest_resource() -> None:
    assert model.members_per_node(gpu_member(2), GPU_GROUP) == 4
    many_cpus = model.member_of(template(cpu="5"))
    assert model.members_per_node(many_cpus, CPU_GROUP) == 1
    assert model.members_per_node(gpu_member(2), CPU_GROUP) == 0


def test_init_containers_count_at_their_peak() -> None:
    spec = template(cpu="1", initContainers=[{"resources": {"requests": {"cpu": "3"}}}])
    assert model.member_of(spec).requests["cpu"] == 3 * 10**9


def test_sizing_picks_the_group_whose_labels_and_taints_fit() -> None:
    demands = [
        PodSetDemand("workers", 16, gpu_member()),
        PodSetDemand("driver", 1, model.member_of(template(nodeSelector={"pool": "cpu"}))),
    ]
    sizing = model.size_request(demands, [GPU_GROUP, CPU_GROUP], {})
    assert sizing.nodes == (("gpu", 16), ("cpu", 1))
    untolerated = model.member_of(template(gpu=1, nodeSelector={"pool": "gpu"}))
    refused = model.size_request([PodSetDemand("w", 1, untolerated)], [GPU_GROUP], {})
    assert refused.problem == "no node group can host a member of w"


def test_taints_the_autoscaler_leaves_out_of_templates_do_not_decide_sizing() -> None:
    """As cluster-autoscaler's SanitizeTaints: startup, status and ignore taints are left out
    of a group's template; any other taint the member does not tolerate still refuses it."""
    member = gpu_member()
    for prefix in model.TEMPLATE_IGNORED_PREFIXES:
        closed = GPU_GROUP.model_copy(
            update={
                "taints": (*GPU_GROUP.taints, model.Taint(key=f"{prefix}x", effect="NoSchedule"))
            }
        )
        assert model.can_host(member, closed), prefix
    other = model.Taint(key="example.com/x", effect="NoSchedule")
    assert not model.can_host(member, GPU_GROUP.model_copy(update={"taints": (other,)}))


def test_sizing_counts_nodes_that_exist_against_max_nodes() -> None:
    demands = [PodSetDemand("workers", 16, gpu_member())]
    assert model.size_request(demands, [GPU_GROUP], {"gpu": 0}).needed == 16
    full = model.size_request(demands, [GPU_GROUP], {"gpu": 3})
    assert full.problem == "workers needs 16 nodes of gpu, which has room for 13"


def test_missing_template_makes_the_request_invalid() -> None:
    sizing = model.size_request([PodSetDemand("gone", 1, None)], [GPU_GROUP], {})
    plan = plan_for(model.DEFAULT_SCENARIO, sizing)
    assert plan.outcome is Outcome.INVALID
    assert [s.condition.reason for s in model.steps(plan) if s.condition] == ["FailedToCreatePods"]


# --- plans and steps -----------------------------------------------------------------------


def timeline(plan: model.Plan) -> list[tuple[float, str]]:
    def what(step: model.Step) -> str:
        if step.node is not None:
            return "node"
        if step.revoke:
            return "revoke"
        assert step.condition is not None
        return f"{step.condition.type}={step.condition.status}"

    return [(step.at, what(step)) for step in model.steps(plan)]


def test_provisioned_comes_before_any_node_and_partial_delivery_stops_short() -> None:
    scenario = Scenario(
        provision_after_seconds=1, node_delay_seconds=2, deliver=11, booking_seconds=60
    )
    plan = plan_for(scenario, Sizing(nodes=(("gpu", 16),)))
    assert plan.needed == 16
    assert len(plan.nodes) == 11
    assert len({n.name for n in plan.nodes}) == 11
    assert all(n.name.startswith("gpu-") and len(n.name) == 9 for n in plan.nodes)
    assert timeline(plan) == [
        (0, "Accepted=True"),
        (1, "Provisioned=True"),
        *[(3, "node")] * 11,
        (61, "BookingExpired=True"),
    ]


def test_stockout_fails_after_the_given_delay() -> None:
    plan = plan_for(Scenario(stockout=True, fail_after_seconds=2), Sizing(nodes=(("gpu", 2),)))
    assert plan.outcome is Outcome.NOT_FOUND
    assert timeline(plan) == [
        (0, "Accepted=True"),
        (0.5, "Provisioned=False"),
        (2.5, "Failed=True"),
    ]


def test_too_big_fails_at_once_only_with_no_retry() -> None:
    sizing = Sizing(problem="no room")
    assert plan_for(model.DEFAULT_SCENARIO, sizing).fail_at is None
    assert plan_for(model.DEFAULT_SCENARIO, sizing, no_retry=True).fail_at == 0.5


def test_late_failure_and_revocation_cut_off_nodes_still_to_come() -> None:
    scenario = Scenario(node_delay_seconds=(1, 5), fail_after_seconds=3, revoke_after_seconds=4)
    plan = plan_for(scenario, Sizing(nodes=(("gpu", 2),)))
    assert timeline(plan) == [
        (0, "Accepted=True"),
        (0.5, "Provisioned=True"),
        (1.5, "node"),
        (3.5, "Failed=True"),
        (4.5, "revoke"),
    ]
    assert plan.fail_message.endswith("1 of 2 arrived")


def test_due_steps_skip_what_is_done_so_a_restart_does_not_repeat_it() -> None:
    plan = plan_for(Scenario(node_delay_seconds=(1, 3)), Sizing(nodes=(("gpu", 2),)))
    first = plan.nodes[0].name
    conditions = [
        {"type": "Accepted", "status": "True", "reason": "Accepted"},
        {"type": "Provisioned", "status": "True", "reason": "CapacityIsProvisioned"},
    ]
    due, next_at = model.due_steps(plan.with_delivered(first), conditions, now=1002.0)
    assert due == []
    assert next_at == 1003.5
    due, _ = model.due_steps(plan, [], now=1002.0)
    assert [s.node.name if s.node else s.condition and s.condition.type for s in due] == [
        "Accepted",
        "Provisioned",
        first,
    ]


def test_plan_round_trips_through_its_annotation() -> None:
    plan = plan_for(Scenario(deliver=1), Sizing(nodes=(("gpu", 2),))).with_delivered("gpu-x")
    obj = {"metadata": {"annotations": {model.PLAN_ANNOTATION: plan.to_json()}}}
    assert model.plan_from_annotations(obj) == plan
    assert plan.undelivered() == {"gpu": 1}


def test_set_condition_keeps_transition_time_while_status_holds() -> None:
    old = [{"type": "Provisioned", "status": "False", "lastTransitionTime": "t0"}]
    wanted = model.Condition("Provisioned", "False", "CapacityIsNotFound", "m")
    [same] = model.set_condition(old, wanted, now="t1", generation=2)
    assert (same["lastTransitionTime"], same["observedGeneration"]) == ("t0", 2)
    flipped = model.Condition("Provisioned", "True", "CapacityIsProvisioned", "m")
    [new] = model.set_condition(old, flipped, now="t1", generation=2)
    assert new["lastTransitionTime"] == "t1"


def test_node_object_carries_group_shape_and_sim_records() -> None:
    node = model.node_object("gpu-abcde", GPU_GROUP, request="ns/r", created_at="c", now="n")
    meta = node["metadata"]
    assert meta["labels"][model.NODEGROUP_LABEL] == "gpu"
    assert meta["labels"]["pool"] == "gpu"
    assert meta["annotations"][model.KWOK_ANNOTATION] == "fake"
    assert node["spec"]["providerID"] == "sim://gpu-abcde"
    assert node["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]
    assert node["status"]["allocatable"][model.GPU] == "8"
