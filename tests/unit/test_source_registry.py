"""The edge's registry of capacity sources: every action type has exactly one handler."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gangcheck.app import SOURCES
from gangcheck.logic.attempt.actions import (
    AnnotateRequest,
    ClaimNode,
    CreateRequest,
    CreateTemplate,
    DeleteRequest,
    DeleteTemplate,
)
from gangcheck.logic.sources.provreq import PROVISIONING_REQUEST
from gangcheck.reconcile import provreq
from gangcheck.reconcile.apply import Applier, SourceEdge, Sources


@dataclass(frozen=True)
class _Unregistered:
    name: str


async def _nothing(applier: Applier, namespace: str, action: object) -> None:
    return None


def test_the_provisioning_request_source_applies_its_own_actions() -> None:
    for kind in (CreateTemplate, CreateRequest, DeleteRequest, DeleteTemplate, AnnotateRequest):
        assert SOURCES.handler(kind) is provreq.EDGE.handlers[kind]
    assert SOURCES.default is PROVISIONING_REQUEST
    assert SOURCES.backend(PROVISIONING_REQUEST.kind) is PROVISIONING_REQUEST
    assert SOURCES.backend("NodeClaim") is None
    assert SOURCES.record("r-1", {"k": "v"}) == AnnotateRequest("r-1", {"k": "v"})


def test_an_action_type_claimed_twice_is_refused() -> None:
    twice = SourceEdge(
        backend=PROVISIONING_REQUEST, handlers={CreateRequest: _nothing}, record=provreq.EDGE.record
    )
    with pytest.raises(ValueError, match="CreateRequest"):
        Sources(provreq.EDGE, twice)
    core = SourceEdge(
        backend=PROVISIONING_REQUEST, handlers={ClaimNode: _nothing}, record=provreq.EDGE.record
    )
    with pytest.raises(ValueError, match="ClaimNode"):
        Sources(core)
    with pytest.raises(ValueError):
        Sources()


async def test_an_action_no_source_registered_is_an_error_not_a_silent_skip() -> None:
    applier = Applier(kube=None, caches=None, sources=SOURCES)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="_Unregistered"):
        await applier.apply("ns", _Unregistered("x"))  # type: ignore[arg-type]


async def test_a_second_source_applies_the_action_types_it_adds() -> None:
    seen: list[tuple[str, object]] = []

    async def record(applier: Applier, namespace: str, action: object) -> None:
        seen.append((namespace, action))

    other = SourceEdge(
        backend=PROVISIONING_REQUEST, handlers={_Unregistered: record}, record=provreq.EDGE.record
    )
    applier = Applier(kube=None, caches=None, sources=Sources(provreq.EDGE, other))  # type: ignore[arg-type]
    await applier.apply("ns", _Unregistered("x"))  # type: ignore[arg-type]
    assert seen == [("ns", _Unregistered("x"))]
