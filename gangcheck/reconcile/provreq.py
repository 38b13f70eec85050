"""The ProvisioningRequest source at the edge: its objects created, annotated and deleted.

The one source registered today (app.py): cluster-autoscaler serves its classes and
gangcheck's Karpenter provisioner serves ``karpenter.gangcheck.io``, both answering the
request. A new source registers a `SourceEdge` of its own beside it.
"""

from __future__ import annotations

from collections.abc import Mapping

from gangcheck.kube.errors import ConflictError
from gangcheck.kube.resources import POD_TEMPLATE, PROVISIONING_REQUEST
from gangcheck.logic.attempt.actions import (
    Action,
    AnnotateRequest,
    CreateRequest,
    CreateTemplate,
    DeleteRequest,
    DeleteTemplate,
)
from gangcheck.logic.attempt.records import RollbackCause
from gangcheck.logic.sources.provreq import PROVISIONING_REQUEST as BACKEND
from gangcheck.logic.timefmt import format_micro_time
from gangcheck.model.names import ASKED_AT_ANNOTATION, ROLLBACK_REASON_ANNOTATION
from gangcheck.reconcile.apply import Applier, SourceEdge


async def create_template(applier: Applier, namespace: str, action: Action) -> None:
    assert isinstance(action, CreateTemplate)
    await applier.create_owned(POD_TEMPLATE, action.body, applier.caches.templates)


async def create_request(applier: Applier, namespace: str, action: Action) -> None:
    """Create the request, stamped with when (``ASKED_AT_ANNOTATION``: the order of requests
    made in the same second, for the arrival ledger)."""
    assert isinstance(action, CreateRequest)
    meta = action.body["metadata"]
    notes = {
        **(meta.get("annotations") or {}),
        ASKED_AT_ANNOTATION: format_micro_time(applier.now()),
    }
    body = {**action.body, "metadata": {**meta, "annotations": notes}}
    await applier.create_owned(PROVISIONING_REQUEST, body, applier.caches.requests)


async def delete_request(applier: Applier, namespace: str, action: Action) -> None:
    """Delete the request at its uid, then its templates; one already gone is done. A
    newer request of that name (Conflict) is not ours to delete, nor are its templates,
    named from the request's name: the same objects."""
    assert isinstance(action, DeleteRequest)
    try:
        await applier.delete_owned(
            PROVISIONING_REQUEST, action.name, namespace, applier.caches.requests, uid=action.uid
        )
    except ConflictError:
        return
    for template in action.templates:
        await delete_template(applier, namespace, DeleteTemplate(template))


async def delete_template(applier: Applier, namespace: str, action: Action) -> None:
    """Delete the template the decision saw (its uid in the cache, when there): one of that
    name made again since is not deleted (ConflictError: the queue decides again)."""
    assert isinstance(action, DeleteTemplate)
    seen = applier.caches.templates.store.get(action.name, namespace)
    uid = seen["metadata"].get("uid") if seen is not None else None
    await applier.delete_owned(
        POD_TEMPLATE, action.name, namespace, applier.caches.templates, uid=uid
    )


async def annotate_request(applier: Applier, namespace: str, action: Action) -> None:
    """Write the attempt's record on its request, the one the decision saw (its uid in the
    cache): a request of that name made again since is not given the record (ReplacedError:
    the queue decides again); a rollback it starts is counted once written, by its cause
    (`RollbackCause`: the word its reason starts with, a few known)."""
    assert isinstance(action, AnnotateRequest)
    reason = action.annotations.get(ROLLBACK_REASON_ANNOTATION)
    patch = {"metadata": {"annotations": action.annotations}}
    seen = applier.caches.requests.store.get(action.name, namespace)
    uid = seen["metadata"].get("uid") if seen is not None else None
    updated = await applier.kube.merge_patch(
        PROVISIONING_REQUEST, action.name, patch, namespace, uid=uid
    )
    applier.caches.requests.store.put_if_newer(updated)
    if reason:
        applier.metrics.rollback(RollbackCause.of(reason).value)


def _record(request: str, annotations: Mapping[str, str]) -> Action:
    return AnnotateRequest(request, dict(annotations))


EDGE = SourceEdge(
    backend=BACKEND,
    handlers={
        CreateTemplate: create_template,
        CreateRequest: create_request,
        DeleteRequest: delete_request,
        DeleteTemplate: delete_template,
        AnnotateRequest: annotate_request,
    },
    record=_record,
)
