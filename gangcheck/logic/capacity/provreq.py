"""The ProvisioningRequest backend: one request (autoscaling.x-k8s.io/v1) per attempt, with a
PodTemplate per pod set; the autoscaler's conditions on it are the attempt's status.

Pure: builds bodies and actions, parses status; reconcile/apply.py creates and deletes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.actions import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    Action,
    AdoptTemplate,
    CreateRequest,
    CreateTemplate,
    DeleteRequest,
)
from gangcheck.logic.capacity.backend import Ask, AttemptRecord, CapacityBackend, Owned
from gangcheck.logic.capacity.status import AttemptStatus, Phase, Signal
from gangcheck.model.objects import Condition, ObjectRef, ProvisioningRequest

Obj = dict[str, Any]

API_VERSION = "autoscaling.x-k8s.io/v1"
KIND = "ProvisioningRequest"
CAPACITY_NOT_FOUND = "CapacityIsNotFound"
"""The reason cluster-autoscaler gives when no node group can host the pods."""


def status_of(req: ProvisioningRequest) -> AttemptStatus:
    """The request's conditions as an attempt status: the one place they are read."""
    conds = req.conditions
    provisioned = conds.get(Phase.PROVISIONED.value)
    failed = conds.get(Phase.FAILED.value)
    return AttemptStatus(
        signals={
            phase: _signal(c)
            for phase in Phase
            if (c := conds.get(phase.value)) is not None and c.is_true
        },
        note=_signal(provisioned) if provisioned and not provisioned.is_true else None,
        capacity_not_found=any(
            c is not None and c.reason == CAPACITY_NOT_FOUND for c in (provisioned, failed)
        ),
        created=req.creation_timestamp,
        asked=sum(p.count for p in req.pod_sets),
    )


def _signal(condition: Condition) -> Signal:
    return Signal(condition.reason, condition.message, condition.last_transition_time)


def owner_reference(ref: ObjectRef, api_version: str, *, controller: bool = True) -> Obj:
    return {
        "apiVersion": api_version,
        "kind": ref.kind,
        "name": ref.name,
        "uid": ref.uid,
        "controller": controller,
        "blockOwnerDeletion": True,
    }


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


def template_bodies(
    ask: Ask, *, also_owned_by: ProvisioningRequest | None = None
) -> tuple[Obj, ...]:
    """The attempt's PodTemplates that do not exist yet, owned by the gang's object (and by
    the request, when it exists already: a template lost while it was in flight)."""
    owners = list(ask.owners)
    if also_owned_by is not None:
        owners.append(owner_reference(also_owned_by.ref, API_VERSION, controller=False))
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
        if owners:
            meta["ownerReferences"] = owners
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


def adoptions(templates: Mapping[str, Owned], req: ProvisioningRequest) -> tuple[Action, ...]:
    """Hand each of the request's PodTemplates that exists to the request, once."""
    out: list[Action] = []
    for ps in req.pod_sets:
        info = templates.get(ps.template_name)
        if info is not None and req.ref.uid not in info.owner_uids:
            out.append(AdoptTemplate(ps.template_name, req.name, req.ref.uid))
    return tuple(out)


def missing_templates(req: ProvisioningRequest, ask: Ask) -> tuple[Action, ...]:
    """Make again the PodTemplates of a request in flight that are gone (garbage-collected
    with an earlier request of the same name deleted by hand), so the attempt is not lost."""
    wanted = {ps.template_name for ps in req.pod_sets}
    if wanted <= ask.existing:
        return ()
    mine = tuple(p for p in ask.pod_sets if naming.template_name(req.name, p.name) in wanted)
    again = replace(ask, pod_sets=mine)
    return tuple(CreateTemplate(b) for b in template_bodies(again, also_owned_by=req))


class ProvisioningRequestBackend:
    """Capacity from cluster-autoscaler (or any ProvisioningRequest controller)."""

    kind = KIND

    def ask(self, ask: Ask) -> tuple[Action, ...]:
        templates = tuple(CreateTemplate(b) for b in template_bodies(ask))
        return (*templates, CreateRequest(request_body(ask)))

    def status_of(self, attempt: AttemptRecord) -> AttemptStatus:
        return status_of(_request(attempt))

    def follow(
        self, attempt: AttemptRecord, made: Mapping[str, Owned], ask: Ask | None = None
    ) -> tuple[Action, ...]:
        req = _request(attempt)
        again = missing_templates(req, ask) if ask is not None else ()
        return again + adoptions(made, req)

    def withdraw(self, attempt: AttemptRecord, reason: str) -> tuple[Action, ...]:
        return (delete_request(_request(attempt), reason),)


def _request(attempt: AttemptRecord) -> ProvisioningRequest:
    assert isinstance(attempt, ProvisioningRequest), attempt
    return attempt


PROVISIONING_REQUEST: CapacityBackend = ProvisioningRequestBackend()
"""The backend gangcheck uses (the only one so far)."""
