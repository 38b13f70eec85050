"""The ProvisioningRequest backend: one request (autoscaling.x-k8s.io/v1) per attempt, with a
PodTemplate per pod set; the autoscaler's conditions on it are the attempt's status.

Pure: builds bodies and actions, parses status; reconcile/apply.py creates and deletes.
"""

from __future__ import annotations

from dataclasses import replace

from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.actions import (
    Action,
    CreateRequest,
    CreateTemplate,
    DeleteRequest,
)
from gangcheck.logic.attempt.backend import Ask, AttemptRecord, CapacityBackend
from gangcheck.logic.attempt.status import AttemptStatus, status_from
from gangcheck.model.names import MANAGED_BY, MANAGED_BY_LABEL
from gangcheck.model.objects import Obj, ProvisioningRequest

KIND = "ProvisioningRequest"


def status_of(req: ProvisioningRequest) -> AttemptStatus:
    """The request's conditions as an attempt status."""
    status = status_from(req.conditions)
    return replace(status, created=req.creation_timestamp, asked=sum(p.count for p in req.pod_sets))


def request_body(ask: Ask) -> Obj:
    """The request: no ownerReference (gangcheck deletes its requests itself; Kueue's own
    provisioning controller deletes requests owned by a Workload that are not its own)."""
    return {
        "metadata": {
            "name": ask.attempt,
            "namespace": ask.namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": {**ask.identity, **ask.record},
        },
        "spec": {
            "provisioningClassName": ask.capacity_class,
            "parameters": dict(ask.parameters),
            "podSets": [
                {
                    "podTemplateRef": {"name": naming.template_name(ask.attempt, p.name)},
                    "count": p.count,
                }
                for p in ask.pod_sets
            ],
        },
    }


def template_bodies(ask: Ask) -> tuple[Obj, ...]:
    """The attempt's PodTemplates that do not exist yet, owned by nothing, naming the gang
    (and its uid) in their annotations.

    Made before the request that points at them: cluster-autoscaler reads a request whose
    template is not there yet as asking for fewer pods (`FetchPodTemplates` skips a template
    not found). Not owned by the gang's object, as the request is not: the garbage collector
    would delete them with the Workload or PodGroup, and an attempt kept open after its gang
    went (lifecycle.promise) reads them to tell which late node its source made for it.
    gangcheck deletes them itself: with their request (DeleteRequest), and the orphan sweep
    those of a gang that is gone (by the uid they name); a request deleted by hand leaves its
    templates until the gang goes."""
    out = []
    for p in ask.pod_sets:
        name = naming.template_name(ask.attempt, p.name)
        if name in ask.existing:
            continue  # created by an earlier, interrupted reconcile
        meta: Obj = {
            "name": name,
            "namespace": ask.namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": dict(ask.identity),
        }
        out.append({"metadata": meta, "template": p.template})
    return tuple(out)


def delete_request(req: ProvisioningRequest, reason: str) -> DeleteRequest:
    """Delete a request and the PodTemplates it points at."""
    return DeleteRequest(
        name=req.name,
        uid=req.ref.uid,
        templates=tuple(p.template_name for p in req.pod_sets),
        reason=reason,
    )


def missing_templates(req: ProvisioningRequest, ask: Ask) -> tuple[Action, ...]:
    """Make again the PodTemplates of a request in flight that are gone (deleted by hand, or
    by gangcheck with an earlier request of the same name), so the attempt is not lost."""
    wanted = {ps.template_name for ps in req.pod_sets}
    if wanted <= ask.existing:
        return ()
    mine = tuple(p for p in ask.pod_sets if naming.template_name(req.name, p.name) in wanted)
    again = replace(ask, pod_sets=mine)
    return tuple(CreateTemplate(b) for b in template_bodies(again))


class ProvisioningRequestBackend:
    """Capacity from cluster-autoscaler (or any ProvisioningRequest controller)."""

    kind = KIND

    def ask(self, ask: Ask) -> tuple[Action, ...]:
        templates = tuple(CreateTemplate(b) for b in template_bodies(ask))
        return (*templates, CreateRequest(request_body(ask)))

    def status_of(self, attempt: AttemptRecord) -> AttemptStatus:
        return status_of(_request(attempt))

    def follow(self, attempt: AttemptRecord, ask: Ask) -> tuple[Action, ...]:
        return missing_templates(_request(attempt), ask)

    def withdraw(self, attempt: AttemptRecord, reason: str) -> tuple[Action, ...]:
        return (delete_request(_request(attempt), reason),)


def _request(attempt: AttemptRecord) -> ProvisioningRequest:
    assert isinstance(attempt, ProvisioningRequest), attempt
    return attempt


PROVISIONING_REQUEST: CapacityBackend = ProvisioningRequestBackend()
"""The backend gangcheck uses (the only one so far)."""
