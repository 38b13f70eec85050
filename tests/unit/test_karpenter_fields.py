"""Which config field a missing or unusable NodePool is reported by: the top-level
``spec.karpenter.nodePools[j]`` or a capacity source's
``spec.capacitySources[i].karpenter.nodePools[j]``, on the AdmissionCheck's Active condition
(every NodePool the config names is looked for) and on a request asking that source."""

from __future__ import annotations

from typing import Any

import pytest

from gangcheck.kube.resources import ADMISSION_CHECK, ATOMIC_CONFIG, NODE_POOL
from gangcheck.logic.sources.karpenter.pools import (
    named_pools,
    source_field,
    unusable_pools,
)
from gangcheck.logic.sources.karpenter.provisioner import pools_field
from gangcheck.model.names import ATTEMPT_CONFIG_ANNOTATION, SOURCE_ANNOTATION
from gangcheck.model.provisioning_config import CHECK_CAPACITY, parse_spec, spec_record
from gangcheck.reconcile.admissioncheck import (
    KARPENTER_UNAVAILABLE,
    NOT_PERMITTED,
    RECHECK_SECONDS,
    AdmissionCheckReconciler,
)
from gangcheck.runtime.queue import Result
from tests.builders import CONTROLLER
from tests.fakes.kube import FakeKube
from tests.unit.test_karpenter_logic import pool
from tests.unit.test_karpenter_provisioner import TEMPLATES, served
from tests.unit.test_karpenter_provisioner import request as karpenter_request

Obj = dict[str, Any]
RECLAIM = {"fulfillment": {"reclaimer": "DeleteNodeClaim"}}
TOP_LEVEL: Obj = {**RECLAIM, "backend": "Karpenter", "karpenter": {"nodePools": ["gpu"]}}
#: A ProvisioningRequest class first, then a Karpenter source.
SECOND_KARPENTER: Obj = {
    **RECLAIM,
    "capacitySources": [
        {"provisioningClassName": CHECK_CAPACITY},
        {"karpenter": {"nodePools": ["x"]}},
    ],
}
#: Two Karpenter sources around a ProvisioningRequest class.
TWO_KARPENTER: Obj = {
    **RECLAIM,
    "capacitySources": [
        {"karpenter": {"nodePools": ["a", "b"]}},
        {"provisioningClassName": CHECK_CAPACITY},
        {"karpenter": {"nodePools": ["c"]}},
    ],
}
NO_KARPENTER: Obj = {
    "capacitySources": [{}, {"provisioningClassName": CHECK_CAPACITY}],
}


# ---- the fields (pure) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("index", "field"),
    [
        (None, "spec.karpenter.nodePools"),
        (0, "spec.capacitySources[0].karpenter.nodePools"),
        (3, "spec.capacitySources[3].karpenter.nodePools"),
    ],
)
def test_the_field_of_a_places_node_pools(index: int | None, field: str) -> None:
    assert source_field(index) == field


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        pytest.param(TOP_LEVEL, [("spec.karpenter.nodePools", ("gpu",))], id="top-level"),
        pytest.param(
            SECOND_KARPENTER,
            [("spec.capacitySources[1].karpenter.nodePools", ("x",))],
            id="the second source",
        ),
        pytest.param(
            TWO_KARPENTER,
            [
                ("spec.capacitySources[0].karpenter.nodePools", ("a", "b")),
                ("spec.capacitySources[2].karpenter.nodePools", ("c",)),
            ],
            id="two sources",
        ),
        pytest.param(NO_KARPENTER, [], id="no Karpenter source"),
        pytest.param({}, [], id="defaults"),
    ],
)
def test_every_list_of_node_pools_a_config_names(spec: Obj, named: list[object]) -> None:
    assert list(named_pools(parse_spec(spec))) == named


@pytest.mark.parametrize(
    ("spec", "served", "problem"),
    [
        pytest.param(TOP_LEVEL, ["gpu"], None, id="top-level, there"),
        pytest.param(
            TOP_LEVEL,
            [],
            "spec.karpenter.nodePools[0]: NodePool 'gpu' not found",
            id="top-level, missing",
        ),
        pytest.param(
            SECOND_KARPENTER,
            ["gpu"],
            "spec.capacitySources[1].karpenter.nodePools[0]: NodePool 'x' not found",
            id="the second source's, missing",
        ),
        pytest.param(SECOND_KARPENTER, ["x"], None, id="the second source's, there"),
        pytest.param(
            TWO_KARPENTER,
            ["a"],
            "spec.capacitySources[0].karpenter.nodePools[1]: NodePool 'b' not found; "
            "spec.capacitySources[2].karpenter.nodePools[0]: NodePool 'c' not found",
            id="two sources, each missing one",
        ),
        pytest.param(
            SECOND_KARPENTER,
            None,
            "the Karpenter backend is unavailable: the API server does not serve "
            "karpenter.sh/v1 NodePools (install Karpenter's CRDs)",
            id="NodePools not served",
        ),
    ],
)
def test_which_node_pools_are_missing_by_their_field(
    spec: Obj, served: list[str] | None, problem: str | None
) -> None:
    pools = None if served is None else {name: pool(name) for name in served}
    assert unusable_pools(named_pools(parse_spec(spec)), pools) == problem


def annotated(spec: Obj | None, source: str | None) -> Obj:
    """A request of the Karpenter class recording ``spec`` and the source it asks."""
    req = karpenter_request()
    notes: dict[str, str] = {}
    if spec is not None:
        notes[ATTEMPT_CONFIG_ANNOTATION] = spec_record(parse_spec(spec))
    if source is not None:
        notes[SOURCE_ANNOTATION] = source
    req["metadata"]["annotations"] = notes
    return req


@pytest.mark.parametrize(
    ("spec", "source", "field"),
    [
        pytest.param(TOP_LEVEL, None, "spec.karpenter.nodePools", id="top-level"),
        pytest.param(
            TWO_KARPENTER,
            None,
            "spec.capacitySources[0].karpenter.nodePools",
            id="the first source (no annotation)",
        ),
        pytest.param(
            SECOND_KARPENTER,
            "1",
            "spec.capacitySources[1].karpenter.nodePools",
            id="the second source",
        ),
        pytest.param(
            TWO_KARPENTER, "2", "spec.capacitySources[2].karpenter.nodePools", id="the third"
        ),
        pytest.param(
            None,
            "2",
            "spec.capacitySources[2].karpenter.nodePools",
            id="no config recorded, a later source",
        ),
        pytest.param(None, None, "spec.karpenter.nodePools", id="no config recorded, no source"),
        pytest.param(
            TWO_KARPENTER,
            "x",
            "spec.capacitySources[0].karpenter.nodePools",
            id="a source annotation not a number",
        ),
    ],
)
def test_the_field_a_request_names_is_the_one_its_attempt_recorded(
    spec: Obj | None, source: str | None, field: str
) -> None:
    assert pools_field(annotated(spec, source)) == field


# ---- a request asking a Karpenter capacity source --------------------------------------------


def failed_message(req: Obj, pools: dict[str, Obj | None]) -> str:
    done = served(req, [], pools)
    assert done.create == ()
    (failed,) = done.conditions
    assert (failed["type"], failed["reason"]) == ("Failed", "NodePoolNotUsable")
    return str(failed["message"])


def test_a_sources_missing_pool_fails_its_request_naming_the_sources_field() -> None:
    message = failed_message(annotated(SECOND_KARPENTER, "1"), {})
    assert message == "spec.capacitySources[1].karpenter.nodePools[0]: NodePool 'gpu' not found"


def test_a_sources_pool_that_cannot_take_the_gang_names_the_sources_field() -> None:
    """The gang selects team=ml; the pool's nodes are labelled team=web."""
    assert TEMPLATES["ppt-train-main"]["template"]["spec"]["nodeSelector"] == {"team": "ml"}
    other = pool(labels={"team": "web"})
    message = failed_message(annotated(SECOND_KARPENTER, "1"), {"gpu": other})
    assert message == (
        "spec.capacitySources[1].karpenter.nodePools[0]: NodePool 'gpu' sets team=web, not ml"
    )


def test_a_top_level_pool_is_still_named_by_spec_karpenter() -> None:
    message = failed_message(annotated(TOP_LEVEL, None), {})
    assert message == "spec.karpenter.nodePools[0]: NodePool 'gpu' not found"


# ---- the AdmissionCheck's Active condition ---------------------------------------------------


def check_of(spec: Obj, *pools: str) -> FakeKube:
    """An AdmissionCheck of ours naming a config of ``spec``, and the NodePools ``pools``."""
    kube = FakeKube()
    kube.add(
        {
            "apiVersion": ADMISSION_CHECK.api_version,
            "kind": ADMISSION_CHECK.kind,
            "metadata": {"name": "atomic", "generation": 1},
            "spec": {
                "controllerName": CONTROLLER,
                "parameters": {
                    "apiGroup": ATOMIC_CONFIG.group,
                    "kind": ATOMIC_CONFIG.kind,
                    "name": "cfg",
                },
            },
        },
        {
            "apiVersion": ATOMIC_CONFIG.api_version,
            "kind": ATOMIC_CONFIG.kind,
            "metadata": {"name": "cfg"},
            "spec": spec,
        },
        *(pool(p, typed=True) for p in pools),
    )
    return kube


async def active_after_reconcile(kube: FakeKube) -> tuple[Obj, Result]:
    result = await AdmissionCheckReconciler(kube, kube.caches()).reconcile("atomic")
    stored = kube.stored(ADMISSION_CHECK, "atomic")
    assert stored is not None
    active = next(c for c in stored["status"]["conditions"] if c["type"] == "Active")
    return active, result


async def test_a_second_sources_missing_pool_makes_the_check_inactive_naming_it() -> None:
    kube = check_of(SECOND_KARPENTER, "gpu")
    active, result = await active_after_reconcile(kube)
    assert (active["status"], active["reason"], active["message"]) == (
        "False",
        KARPENTER_UNAVAILABLE,
        "spec.capacitySources[1].karpenter.nodePools[0]: NodePool 'x' not found",
    )
    assert result == Result(requeue_after=RECHECK_SECONDS)
    kube.add(pool("x", typed=True))
    active, result = await active_after_reconcile(kube)
    assert (active["status"], active["reason"]) == ("True", "Active")
    assert result == Result(requeue_after=RECHECK_SECONDS)


async def test_a_sources_pool_deleted_while_active_turns_the_check_inactive() -> None:
    kube = check_of(SECOND_KARPENTER, "x")
    active, result = await active_after_reconcile(kube)
    assert active["status"] == "True"
    assert result == Result(requeue_after=RECHECK_SECONDS)  # looked at again while active
    kube.remove(NODE_POOL, "x")
    active, _ = await active_after_reconcile(kube)
    assert (active["status"], active["message"]) == (
        "False",
        "spec.capacitySources[1].karpenter.nodePools[0]: NodePool 'x' not found",
    )


async def test_every_sources_missing_pool_is_named() -> None:
    active, _ = await active_after_reconcile(check_of(TWO_KARPENTER, "b"))
    assert (active["status"], active["message"]) == (
        "False",
        "spec.capacitySources[0].karpenter.nodePools[0]: NodePool 'a' not found; "
        "spec.capacitySources[2].karpenter.nodePools[0]: NodePool 'c' not found",
    )


@pytest.mark.parametrize(
    ("status", "message"),
    [
        pytest.param(
            404,
            "the Karpenter backend is unavailable: the API server does not serve "
            "karpenter.sh/v1 NodePools (install Karpenter's CRDs)",
            id="NodePools not served",
        ),
        pytest.param(403, NOT_PERMITTED, id="NodePools not listable"),
    ],
)
async def test_a_karpenter_source_without_karpenter_makes_the_check_inactive(
    status: int, message: str
) -> None:
    kube = check_of(SECOND_KARPENTER)
    kube.fail("list", NODE_POOL.kind, error=status)
    active, result = await active_after_reconcile(kube)
    assert (active["status"], active["reason"], active["message"]) == (
        "False",
        KARPENTER_UNAVAILABLE,
        message,
    )
    assert result == Result(requeue_after=RECHECK_SECONDS)


@pytest.mark.parametrize("status", [404, 403])
async def test_a_config_without_a_karpenter_source_never_asks_for_node_pools(status: int) -> None:
    kube = check_of(NO_KARPENTER)
    kube.fail("list", NODE_POOL.kind, error=status)
    active, result = await active_after_reconcile(kube)
    assert (active["status"], active["reason"]) == ("True", "Active")
    assert result == Result()
    assert [c for c in kube.calls if c.kind == NODE_POOL.kind] == []
