"""`gangcheck diagnose podgroup/…` and PodGroup rows of `gangcheck status`, on a real API server.

As in test_podgroups.py the test plays the webhook (members are created gated) and the
autoscaler (it sets the request's conditions and adds the nodes) while the PodGroup
provisioner runs; the diagnosis reads what the API server holds.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gangcheck.app import Controller
from gangcheck.diagnose import GroupReport, diagnose, main_diagnose, main_status
from gangcheck.kube.client import Kube
from gangcheck.kube.resources import ATOMIC_CONFIG
from gangcheck.model.names import CONFIG_ANNOTATION, UNGATED_ANNOTATION
from tests.integration.harness import eventually
from tests.integration.test_diagnose import run_cli
from tests.integration.test_podgroup_growth import growing, set_min_count
from tests.integration.test_podgroup_growth import short_start as short_start  # noqa: PLC0414
from tests.integration.test_podgroups import (  # the PodGroup fixtures, reused
    Groups,
    groups,  # noqa: F401
    provisioner,  # noqa: F401
)

pytestmark = pytest.mark.integration


async def report_of(kube: Kube, target: str, wanted: str | re.Pattern[str]) -> GroupReport:
    """The diagnosis, once its verdict line says what the test expects."""

    async def probe() -> GroupReport | None:
        report = await diagnose(kube, target)
        assert isinstance(report, GroupReport)
        line = report.verdict.line
        matched = wanted.fullmatch(line) if isinstance(wanted, re.Pattern) else line == wanted
        return report if matched else None

    return await eventually(probe, timeout=20, what=f"verdict {wanted!r}")


def kubeconfig(control_plane: Any) -> list[str]:
    return ["--kubeconfig", str(control_plane.kubeconfig)]


async def test_a_gang_short_of_members_says_how_many_exist(
    groups: Groups,  # noqa: F811
    provisioner: Controller,  # noqa: F811
    control_plane: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await groups.upstream("train", 4)
    for i in range(2):
        await groups.member(f"train-{i}", "train")
    await groups.wait_state("train", "WaitingForMembers")
    target = f"podgroup/{groups.ns}/train"
    await report_of(groups.kube, target, "blocked: waiting for members: 2 of 4 exist")

    code, out, err = await run_cli(main_diagnose, [target, *kubeconfig(control_plane)], capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"PodGroup {groups.ns}/train (scheduling.k8s.io/v1beta1)"
    assert "members   2 of 4 exist: 2 gated, 0 bound" in lines
    assert "state     WaitingForMembers, attempt 1" in lines
    assert lines[-1] == "blocked: waiting for members: 2 of 4 exist"

    # A member named as a pod leads to its group.
    pod = f"pod/{groups.ns}/train-1"
    code, out, _ = await run_cli(main_diagnose, [pod, *kubeconfig(control_plane)], capsys)
    assert code == 0
    assert out.splitlines()[0].startswith(f"Pod {groups.ns}/train-1 -> PodGroup {groups.ns}/train")


async def test_a_coscheduling_gang_in_flight_names_its_request_and_the_fit(
    groups: Groups,  # noqa: F811
    provisioner: Controller,  # noqa: F811
    control_plane: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = groups.cluster
    await cluster.add_nodes(1, gpu=1)  # room for one of the two
    await groups.coscheduling("ddp", 2)
    for i in range(2):
        await groups.member(f"ddp-{i}", "ddp", plugins=True)
    await cluster.set_request_conditions("ddp-coscheduling-1", {"Accepted": ""})
    # No upstream PodGroup of that name: the heuristic finds the scheduler-plugins one.
    requested = re.compile(
        r"blocked: capacity requested \(ddp-coscheduling-1, accepted, not provisioned yet, "
        r"deadline in \S+\): 1 of 2 members placeable on 1 node; .*"
    )
    report = await report_of(cluster.kube, f"podgroup/{groups.ns}/ddp", requested)
    assert report.facts.api_group == "scheduling.x-k8s.io"
    assert report.facts.state == "Provisioning"
    assert report.facts.request is not None and report.facts.request.found

    argv = [f"podgroup.scheduling.x-k8s.io/{groups.ns}/ddp", "-o", "json"]
    code, out, _ = await run_cli(main_diagnose, [*argv, *kubeconfig(control_plane)], capsys)
    assert code == 0
    parsed = json.loads(out)
    assert parsed["kind"] == "PodGroupDiagnosis"
    assert parsed["members"]["gated"] == ["ddp-0", "ddp-1"]
    assert parsed["request"]["name"] == "ddp-coscheduling-1"
    assert [c["type"] for c in parsed["request"]["conditions"]] == ["Accepted"]
    assert parsed["nodes"]["placeable"] == 1
    assert requested.fullmatch(parsed["verdict"]["line"])

    argv = ["-n", groups.ns, *kubeconfig(control_plane)]
    code, out, _ = await run_cli(main_status, argv, capsys)
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 2, out
    header, row = lines
    assert header.split()[:3] == ["KIND", "NAMESPACE/NAME", "CHECK"]
    assert row.split()[:5] == [
        "PodGroup.scheduling.x-k8s.io",
        f"{groups.ns}/ddp",
        "-",
        "Provisioning",
        "requested",
    ]

    # As the autoscaler: provisioned, and the missing node arrives.
    await cluster.set_request_conditions("ddp-coscheduling-1", {"Provisioned": "ok"})
    await cluster.add_nodes(1, gpu=1)
    await groups.wait_state("ddp", "Released", plugins=True)
    # its start deadline, counted from the release gangcheck recorded on the group
    binding = re.compile(
        r"not blocked: released: 2 members released together; 0 of 2 bound so far "
        r"\(kube-scheduler's turn\), start deadline in \w+, rolled back unless all are by then"
    )
    report = await report_of(cluster.kube, f"podgroup/{groups.ns}/ddp", binding)
    start = report.facts.start
    assert start is not None and start.released_at is not None and start.watched
    assert (sorted(start.members), start.bound) == (["ddp-0", "ddp-1"], ())
    assert start.start_deadline_seconds == 600  # the default config's


async def test_a_gang_blocked_by_ungated_members_is_in_status_and_diagnose_says_what_gangcheck_did(
    groups: Groups,  # noqa: F811
    provisioner: Controller,  # noqa: F811
    control_plane: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Members created without the gate in an opted-in namespace (the webhook down): the
    controller records them and sends Events; status lists the gang with its verdict, and
    diagnose says what gangcheck reported rather than that it did nothing."""
    await groups.upstream("leaky", 2)
    for i in range(2):
        await groups.member(f"leaky-{i}", "leaky", gated=False)

    async def recorded() -> bool:
        notes = (await groups.group("leaky"))["metadata"].get("annotations") or {}
        return notes.get(UNGATED_ANNOTATION) == "leaky-0,leaky-1"

    await eventually(recorded, what="the ungated members recorded on the group")
    await eventually(lambda: groups.cluster.events("MemberNotGated"), what="the Events")

    argv = ["-n", groups.ns, *kubeconfig(control_plane)]
    code, out, _ = await run_cli(main_status, argv, capsys)
    assert code == 0
    header, row = out.splitlines()
    assert header.split()[-3:] == ["NODES", "MEMBERS", "VERDICT"]
    assert row.startswith(f"PodGroup  {groups.ns}/leaky")
    assert row.endswith(
        "blocked: members not gated: the webhook may be down (pods leaky-0, leaky-1)"
    )
    assert "?" not in row

    target = f"podgroup/{groups.ns}/leaky"
    code, out, _ = await run_cli(main_diagnose, [target, *kubeconfig(control_plane)], capsys)
    assert code == 0
    assert "has not acted" not in out
    assert "gangcheck reported 2 member(s) created without" in out


async def test_members_without_the_gate_and_a_missing_group_are_named(
    groups: Groups,  # noqa: F811
    control_plane: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # No controller, no webhook: members arrive as they were created.
    await groups.upstream("plain", 2)
    await groups.member("plain-0", "plain", gated=False)
    await groups.member("plain-1", "plain", gated=False)
    await report_of(
        groups.kube,
        f"podgroup/{groups.ns}/plain",
        "blocked: members not gated: the webhook may be down (pods plain-0, plain-1)",
    )

    await groups.member("orphan-0", "gone")
    await report_of(
        groups.kube,
        f"podgroup/{groups.ns}/gone",
        "blocked: PodGroup not found; 1 gated member names it and waits for it (pod orphan-0)",
    )

    argv = [f"podgroup/{groups.ns}/nope", *kubeconfig(control_plane)]
    code, out, err = await run_cli(main_diagnose, argv, capsys)
    assert (code, out) == (1, "")
    assert err == f"gangcheck: PodGroup {groups.ns}/nope not found\n"


async def test_a_gang_on_its_third_attempt_says_why_the_first_two_ended(
    groups: Groups,  # noqa: F811
    provisioner: Controller,  # noqa: F811
    control_plane: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Why is my PodGroup still pending: its first two requests failed (as an autoscaler
    says it has no capacity), each rolled back and retried after the backoff. Attempt 3 in
    flight, diagnose says both earlier attempts from the group's RolledBack Events (no
    annotation keeps them): which request, why, when; text and JSON alike. status counts
    the attempts."""
    config = f"retry-{groups.ns}"
    spec = {"retryStrategy": {"backoffLimitCount": 3, "backoffBaseSeconds": 1}}
    await groups.kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": spec})
    try:
        await groups.upstream("retry", 2, annotations={CONFIG_ANNOTATION: config})
        for i in range(2):
            await groups.member(f"retry-{i}", "retry")
        for attempt in (1, 2):
            failed = {"Failed": f"no capacity for attempt {attempt}"}
            await groups.cluster.set_request_conditions(f"retry-pg-{attempt}", failed)
        await groups.cluster.wait_request("retry-pg-3", timeout=30)
        target = f"podgroup/{groups.ns}/retry"

        async def both_said() -> GroupReport | None:
            report = await diagnose(groups.kube, target)
            assert isinstance(report, GroupReport)
            return report if len(report.earlier) == 2 else None

        report = await eventually(both_said, timeout=20, what="attempts 1 and 2 said")
        assert (report.facts.state, report.facts.attempt) == ("Provisioning", 3)
        argv = [target, "-o", "json", *kubeconfig(control_plane)]
        code, out, _ = await run_cli(main_diagnose, argv, capsys)
        assert code == 0
        earlier = json.loads(out)["earlierAttempts"]
        assert [(e["attempt"], e["state"]) for e in earlier] == [
            (1, "RolledBack"),
            (2, "RolledBack"),
        ], earlier
        for attempt, each in enumerate(earlier, 1):
            said = f"rolled back retry-pg-{attempt} (Failed: no capacity for attempt {attempt})"
            assert each["message"].startswith(said), each
            assert each["at"] is not None
        assert earlier[0]["at"] <= earlier[1]["at"]

        code, out, _ = await run_cli(main_diagnose, [target, *kubeconfig(control_plane)], capsys)
        assert code == 0
        flat = " ".join(out.split())
        assert "state Provisioning, attempt 3" in flat
        assert f"earlier {earlier[0]['line']} {earlier[1]['line']}" in flat

        argv = ["-n", groups.ns, "-o", "json", *kubeconfig(control_plane)]
        code, out, _ = await run_cli(main_status, argv, capsys)
        assert code == 0
        (row,) = json.loads(out)["items"]
        assert (row["name"], row["attempt"]) == ("retry", 3)
    finally:
        await groups.kube.delete(ATOMIC_CONFIG, config)


async def released_onto_growth(
    groups: Groups,  # noqa: F811
    name: str,
    config: str | None = None,
) -> str:
    """minCount 2 -> 4 on a running group: the growth's 2 members (`name`-2, -3) released
    onto the 2 nodes that came for it, the first bound there (as kube-scheduler would), the
    other never: the growth's request."""
    await growing(groups, name, config)
    request = f"{name}-pg-grow-1"
    await groups.cluster.set_request_conditions(request, {"Provisioned": "ok"})
    nodes = await groups.cluster.add_nodes(2, gpu=1)

    async def released() -> bool | None:
        return True if await groups.gated(f"{name}-2", f"{name}-3") == [False, False] else None

    await eventually(released, timeout=20, what="the growth's 2 members released")
    await groups.bind(f"{name}-2", nodes[0])
    return request


async def test_a_growth_binding_says_how_long_its_start_watchdog_leaves_it(
    groups: Groups,  # noqa: F811
    provisioner: Controller,  # noqa: F811
    control_plane: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A growth delivered (the default startDeadlineSeconds, 600 s), one of its 2 members
    bound: diagnose says how long is left before it is rolled back, counted from the release
    time gangcheck recorded on its request; the text and -o json agree."""
    request = await released_onto_growth(groups, "slow")
    watched = re.compile(
        r"not blocked: released: 2 members released together, 2 more since; 3 of 4 bound so "
        r"far \(kube-scheduler's turn\); growth slow-pg-grow-1: 1 of the 2 members released "
        r"onto it bound, start deadline in \d+m(\d+s)?, rolled back unless all are by then"
    )
    await report_of(groups.kube, f"podgroup/{groups.ns}/slow", watched)
    notes = ((await groups.cluster.request(request)) or {})["metadata"]["annotations"]

    argv = [f"podgroup/{groups.ns}/slow", *kubeconfig(control_plane)]
    code, out, _ = await run_cli(main_diagnose, [*argv, "-o", "json"], capsys)
    assert code == 0
    grown = json.loads(out)["growth"]
    assert grown["request"]["name"] == request
    assert grown["request"]["phase"] == "Fulfilled"
    assert (grown["members"], grown["bound"]) == (["slow-2", "slow-3"], ["slow-2"])
    assert grown["releasedAt"] == notes["gangcheck.io/released-at"]
    assert (grown["startDeadlineSeconds"], grown["watched"], grown["rolledBack"]) == (
        600,
        True,
        None,
    )
    assert 0 < grown["secondsLeft"] <= 600

    code, out, _ = await run_cli(main_diagnose, argv, capsys)
    assert code == 0
    flat = " ".join(out.split())
    assert f"growth {groups.ns}/{request} (attempt 1)" in flat
    assert f"2 members released onto it at {grown['releasedAt']}: 1 bound" in flat
    assert f"start deadline {grown['startDeadline']} (in " in flat
    assert watched.fullmatch(out.splitlines()[-1])


async def test_a_growth_in_flight_says_what_it_waits_for_and_members_beyond_it_wait(
    groups: Groups,  # noqa: F811
    provisioner: Controller,  # noqa: F811
    control_plane: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """minCount 2 -> 4: while the growth's request is not answered, then accepted, diagnose
    names it and its answer (not 'is the controller running?'); delivered, one of its members
    bound, minCount raised to 5: the member added beyond it waits for its members, no growth
    asked for it meanwhile, and the text and -o json agree."""
    await growing(groups, "wide")
    request, target = "wide-pg-grow-1", f"podgroup/{groups.ns}/wide"
    asks = (
        r"blocked: released: 2 members released together; growth wide-pg-grow-1 asks for the 2 "
        r"gated members minCount 4 added \(wide-2, wide-3\): capacity requested "
        r"\(wide-pg-grow-1, {answer}, deadline in \w+\).*"
    )
    report = await report_of(
        groups.kube, target, re.compile(asks.format(answer="not accepted yet"))
    )
    grown = report.facts.growth
    assert grown is not None and (grown.asks, grown.delivered) == (("wide-2", "wide-3"), False)
    await groups.cluster.set_request_conditions(request, {"Accepted": "ok"})
    accepted = asks.format(answer="accepted, not provisioned yet")
    await report_of(groups.kube, target, re.compile(accepted))

    await groups.cluster.set_request_conditions(request, {"Provisioned": "ok"})
    nodes = await groups.cluster.add_nodes(2, gpu=1)

    async def released() -> bool | None:
        return True if await groups.gated("wide-2", "wide-3") == [False, False] else None

    await eventually(released, timeout=20, what="the growth's 2 members released")
    await groups.bind("wide-2", nodes[0])
    await set_min_count(groups, "wide", 5)
    await groups.member("wide-4", "wide")
    beyond = re.compile(
        r"blocked: released: 2 members released together, 2 more since; growth wide-pg-grow-1: "
        r"1 of the 2 members released onto it bound, start deadline in \w+, rolled back unless "
        r"all are by then; 1 gated member beyond it \(wide-4\) waits until they are all "
        r"bound, then the next growth asks for it"
    )
    await report_of(groups.kube, target, beyond)
    assert await groups.cluster.request("wide-pg-grow-2") is None
    assert await groups.gated("wide-4") == [True]

    argv = [target, *kubeconfig(control_plane)]
    code, out, _ = await run_cli(main_diagnose, [*argv, "-o", "json"], capsys)
    assert code == 0
    said = json.loads(out)["growth"]
    assert (said["delivered"], said["gated"], said["beyond"]) == (True, ["wide-4"], ["wide-4"])
    code, out, _ = await run_cli(main_diagnose, argv, capsys)
    assert code == 0
    assert "gated members waiting on it: wide-4" in " ".join(out.split())
    assert beyond.fullmatch(out.splitlines()[-1])


async def test_a_growth_its_start_watchdog_rolled_back_is_said_so(
    groups: Groups,  # noqa: F811
    provisioner: Controller,  # noqa: F811
    short_start: str,
    control_plane: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same growth under startDeadlineSeconds 4: rolled back (StartDeadline), its outcome
    recorded; diagnose says so with what the rollback did, blocked while its member is
    unbound; the text and -o json agree."""
    request = await released_onto_growth(groups, "late", short_start)
    await groups.cluster.wait_events("GrowthRolledBack", timeout=40)
    rolled = re.compile(
        r"blocked: released: 2 members released together, 2 more since; growth "
        r"late-pg-grow-1 was rolled back: StartDeadline: 1 of 2 members released together "
        r"bound within 4s of their release \(unbound: late-3\); .+; 3 of 4 bound so far "
        r"\(kube-scheduler's turn\)"
    )
    report = await report_of(groups.kube, f"podgroup/{groups.ns}/late", rolled)
    assert report.facts.growth is not None and report.facts.growth.request.outcome is not None

    argv = [f"podgroup/{groups.ns}/late", *kubeconfig(control_plane)]
    code, out, _ = await run_cli(main_diagnose, [*argv, "-o", "json"], capsys)
    assert code == 0
    parsed = json.loads(out)
    grown = parsed["growth"]
    assert grown["request"]["name"] == request
    assert grown["rolledBack"] == grown["request"]["rollbackReason"]
    assert grown["rolledBack"].startswith("StartDeadline: 1 of 2 members")
    summary = grown["request"]["outcome"]["summary"]
    assert f"{grown['rolledBack']}; {summary};" in parsed["verdict"]["line"]
    assert grown["watched"] is False

    code, out, _ = await run_cli(main_diagnose, argv, capsys)
    assert code == 0
    flat = " ".join(out.split())
    assert f"rollback: {grown['rolledBack']}" in flat
    assert f"outcome: {summary}" in flat
    assert out.splitlines()[-1] == parsed["verdict"]["line"]


async def test_a_podgroup_of_an_unknown_api_fails_before_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = await run_cli(main_diagnose, ["podgroup.example.com/ns/pg"], capsys)
    assert (code, out) == (1, "")
    assert err.startswith("gangcheck: unknown kind 'podgroup.example.com'")
    assert err.count("\n") == 1
