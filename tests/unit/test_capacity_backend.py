"""The capacity-backend seam and its ProvisioningRequest implementation, as tables."""

from __future__ import annotations

import pytest

from gangcheck.logic.attempt.actions import CreateRequest, CreateTemplate, DeleteRequest
from gangcheck.logic.attempt.backend import Ask, AskedPodSet, CapacityBackend
from gangcheck.logic.attempt.status import AttemptStatus, Phase, Signal
from gangcheck.logic.sources.provreq import PROVISIONING_REQUEST, ProvisioningRequestBackend
from gangcheck.model.objects import request_of
from tests.builders import pod_template, provisioning_request

TEMPLATE = pod_template(gpu=1)


def status(conditions: dict[str, str], **kw: str) -> AttemptStatus:
    """The status of a request whose conditions have these statuses (and fields `kw`)."""
    obj = provisioning_request("r-1", templates=[("ppt-r-1-workers", 4)], conditions=conditions)
    for c in obj["status"]["conditions"]:
        c.update(status=conditions[c["type"]], message="", **kw)
    return PROVISIONING_REQUEST.status_of(request_of(obj))


@pytest.mark.parametrize(
    ("conditions", "started", "phase"),
    [
        ({}, False, Phase.PENDING),
        ({"Accepted": "True"}, False, Phase.ACCEPTED),
        ({"Accepted": "True", "Provisioned": "False"}, False, Phase.ACCEPTED),
        ({"Accepted": "True", "Provisioned": "True"}, False, Phase.PROVISIONED),
        ({"Provisioned": "True", "BookingExpired": "True"}, False, Phase.EXPIRED),
        ({"Provisioned": "True", "BookingExpired": "True"}, True, Phase.PROVISIONED),
        ({"Provisioned": "True", "CapacityRevoked": "True"}, True, Phase.REVOKED),
        ({"CapacityRevoked": "True", "Failed": "True"}, False, Phase.FAILED),
    ],
    ids=[
        "a request with no conditions is pending",
        "an accepted request is accepted",
        "provisioned false does not provision",
        "provisioned wins over accepted",
        "an expired booking rules before the gang started",
        "an expired booking no longer matters once the gang started",
        "revoked capacity rules even after the start",
        "failure rules over everything",
    ],
)
def test_the_phase_follows_kueues_precedence(
    conditions: dict[str, str], started: bool, phase: Phase
) -> None:
    assert status(conditions).phase(started=started) is phase


def test_the_status_keeps_what_the_autoscaler_said() -> None:
    s = status({"Accepted": "True", "Provisioned": "False"}, reason="CapacityIsNotFound")
    assert s.note == Signal("CapacityIsNotFound", "", "2026-11-30T10:00:00Z")
    assert s.capacity_not_found
    assert s.asked == 4
    assert not s.has_ended
    assert status({"Failed": "True"}, reason="Quota").signal(Phase.FAILED).text == "Quota"


def ask(existing: frozenset[str] = frozenset()) -> Ask:
    return Ask(
        attempt="wl-atomic-1",
        namespace="ns",
        pod_sets=(AskedPodSet("workers", 4, TEMPLATE),),
        identity={"gangcheck.io/workload": "wl"},
        record={"gangcheck.io/attempt": "1"},
        capacity_class="queued-provisioning.gke.io",
        parameters={"a": "b"},
        existing=existing,
    )


def test_an_ask_is_a_request_and_a_template_per_pod_set() -> None:
    template, request = PROVISIONING_REQUEST.ask(ask())
    assert isinstance(template, CreateTemplate)
    assert isinstance(request, CreateRequest)
    assert template.body["metadata"]["name"] == "ppt-wl-atomic-1-workers"
    assert template.body["metadata"]["annotations"] == {"gangcheck.io/workload": "wl"}
    assert "ownerReferences" not in template.body["metadata"]  # gangcheck deletes them
    assert template.body["template"] == TEMPLATE
    assert request.body["metadata"]["annotations"] == {
        "gangcheck.io/workload": "wl",
        "gangcheck.io/attempt": "1",
    }
    assert "ownerReferences" not in request.body["metadata"]
    assert request.body["spec"] == {
        "provisioningClassName": "queued-provisioning.gke.io",
        "parameters": {"a": "b"},
        "podSets": [{"podTemplateRef": {"name": "ppt-wl-atomic-1-workers"}, "count": 4}],
    }


def test_an_ask_skips_templates_that_exist() -> None:
    actions = PROVISIONING_REQUEST.ask(ask(frozenset({"ppt-wl-atomic-1-workers"})))
    assert [type(a) for a in actions] == [CreateRequest]


def test_following_writes_nothing_while_the_templates_exist_and_makes_lost_ones_again() -> None:
    req = request_of(
        provisioning_request("wl-atomic-1", templates=[("ppt-wl-atomic-1-workers", 4)])
    )
    assert PROVISIONING_REQUEST.follow(req, ask(frozenset({"ppt-wl-atomic-1-workers"}))) == ()
    (again,) = PROVISIONING_REQUEST.follow(req, ask())
    assert isinstance(again, CreateTemplate)
    assert again.body["metadata"]["name"] == "ppt-wl-atomic-1-workers"
    # Owned by nothing, as when first made: no write hands it to the request.
    assert "ownerReferences" not in again.body["metadata"]


def test_withdrawing_deletes_the_request_and_its_templates() -> None:
    req = request_of(
        provisioning_request("wl-atomic-1", templates=[("ppt-wl-atomic-1-workers", 4)])
    )
    assert PROVISIONING_REQUEST.withdraw(req, "gone") == (
        DeleteRequest("wl-atomic-1", "uid-wl-atomic-1", ("ppt-wl-atomic-1-workers",), "gone"),
    )


def test_the_provisioning_request_backend_is_a_capacity_backend() -> None:
    backend: CapacityBackend = ProvisioningRequestBackend()
    assert backend.kind == "ProvisioningRequest"
