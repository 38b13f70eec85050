"""A NodeClaim the real API server refuses for what it is, on a kube-apiserver serving
Karpenter's own NodePool and NodeClaim CRDs (from the module the test bed pins): a
ValidatingAdmissionPolicy denying one gang's claims. That gang's request fails quoting the
policy (not "the Karpenter backend's RBAC is not installed", though the policy may answer
403), none of its claims is left, and the other gang of the same pass gets its claims. (Before:
the 403 was told as missing RBAC and every pass backed off; the 422 ended each pass, the other
gang never served.)"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any
from unittest import mock

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError, NotFoundError, error_from_status
from gangcheck.kube.resources import (
    NAMESPACE,
    NODE_CLAIM,
    NODE_POOL,
    POD_TEMPLATE,
    PROVISIONING_REQUEST,
)
from gangcheck.logic.sources.karpenter import names
from gangcheck.logic.sources.karpenter.claims import claim_name
from gangcheck.model.names import MANAGED_BY, MANAGED_BY_LABEL
from gangcheck.model.provisioning_config import KARPENTER_CLASS
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.karpenter import KarpenterProvisioner
from tests.integration.harness import apply, deny_policy
from tests.integration.test_diagnose import node_claim_crd
from tests.integration.test_karpenter_source_pools import (  # the fixture: pytest finds it here
    node_pool,
    node_pool_crd,  # noqa: F401
)
from tests.integration.test_manifests import remove_namespace

pytestmark = pytest.mark.integration
Obj = dict[str, Any]
MANAGED = {MANAGED_BY_LABEL: MANAGED_BY}


@pytest.fixture
def claim_crd(control_plane: ControlPlane) -> Iterator[None]:
    with node_claim_crd(control_plane, installed=True):
        yield


def request(namespace: str, gang: str) -> Obj:
    return {
        "metadata": {"name": f"{gang}-check-1", "namespace": namespace, "labels": MANAGED},
        "spec": {
            "provisioningClassName": KARPENTER_CLASS,
            "parameters": {"nodePools": f"pool-{namespace}"},
            "podSets": [{"podTemplateRef": {"name": f"ppt-{gang}"}, "count": 2}],
        },
    }


def template(namespace: str, gang: str) -> Obj:
    gpus = {"nvidia.com/gpu": "8"}
    container = {"name": "c", "image": "x", "resources": {"requests": gpus, "limits": gpus}}
    return {
        "metadata": {"name": f"ppt-{gang}", "namespace": namespace, "labels": MANAGED},
        "template": {"spec": {"containers": [container]}},
    }


@contextlib.contextmanager
def policy(control_plane: ControlPlane, name: str, denied: str, reason: str) -> Iterator[str]:
    """A ValidatingAdmissionPolicy (and its binding) denying the creation of NodeClaims made
    for the gang request ``denied`` (``namespace/name``); yields the message it denies with."""
    said = "claims of this gang are not allowed here"
    validation: Obj = {"expression": "false", "message": said}
    if reason:
        validation["reason"] = reason
    requested_for = f"object.metadata.annotations['{names.REQUESTED_FOR}']"
    the_denied_gang = {
        "name": "the-denied-gang",
        "expression": f"has(object.metadata.annotations) && "
        f"'{names.REQUESTED_FOR}' in object.metadata.annotations && "
        f"{requested_for} == '{denied}'",
    }
    manifests = deny_policy(
        name,
        {
            "apiGroups": [names.GROUP],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["nodeclaims"],
        },
        validation,
        match_conditions=[the_denied_gang],
    )
    apply(control_plane, manifests)
    try:
        yield said
    finally:
        control_plane.run_kubectl("delete", "--ignore-not-found", "-f", "-", stdin=manifests)


@contextlib.asynccontextmanager
async def running(kube: Kube, *, requests: bool = True) -> AsyncIterator[Caches]:
    """The informers a provisioner's pass reads, synced. `requests=False`: the requests'
    cache is not filled, synced empty: the pass sees no request of any class, whatever other
    tests of the session left on the shared API server."""
    caches = Caches.create(kube, watch_timeout=30)
    informers = (caches.requests, caches.templates, caches.nodes)
    if not requests:
        caches.requests.synced.set()
        informers = (caches.templates, caches.nodes)
    tasks = [asyncio.create_task(i.run()) for i in informers]
    try:
        for informer in informers:
            await asyncio.wait_for(informer.synced.wait(), 30)
        yield caches
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def until(check: Any, timeout: float = 20.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = await check()
        if found:
            return found
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("not seen in time")
        await asyncio.sleep(0.2)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("reason", ["Forbidden", ""], ids=["403", "default-reason"])
async def test_a_claim_a_policy_refuses_fails_only_its_gang_quoting_the_policy(
    control_plane: ControlPlane,
    node_pool_crd: None,  # noqa: F811
    claim_crd: None,
    reason: str,
) -> None:
    namespace = f"karp-refused-{uuid.uuid4().hex[:8]}"
    pool = f"pool-{namespace}"
    name = f"deny-{namespace}"
    async with await Kube.connect(str(control_plane.kubeconfig)) as admin:
        await admin.create(NAMESPACE, {"metadata": {"name": namespace}})
        await admin.create(NODE_POOL, node_pool(pool))
        try:
            with policy(control_plane, name, f"{namespace}/a-check-1", reason) as said:
                for gang in ("a", "b"):
                    await admin.create(POD_TEMPLATE, template(namespace, gang), namespace)
                    await admin.create(PROVISIONING_REQUEST, request(namespace, gang), namespace)
                await asyncio.sleep(1.1)  # claims are made a second after their request

                async def claims(gang: str) -> list[Obj]:
                    listed = await admin.list_objects(
                        NODE_CLAIM, label_selector=names.ATTEMPT_LABEL
                    )
                    key = f"{namespace}/{gang}-check-1"
                    return [
                        c
                        for c in listed["items"]
                        if c["metadata"]["annotations"].get(names.REQUESTED_FOR) == key
                    ]

                async def failed() -> Obj | None:
                    got = await admin.get(PROVISIONING_REQUEST, "a-check-1", namespace)
                    conditions = (got.get("status") or {}).get("conditions") or []
                    return next((c for c in conditions if c["type"] == "Failed"), None)

                async with running(admin) as caches:
                    karpenter = KarpenterProvisioner(admin, caches)
                    await karpenter.pass_once()
                    made_for_b = await claims("b")
                    condition = await until(failed)
                    await until(lambda: _none_left(claims, "a", karpenter))
        finally:
            await _clean(admin, control_plane, namespace, pool)
    assert len(made_for_b) == 2  # served in the same pass
    assert condition["reason"] == "NodeClaimRefused"
    assert condition["message"].startswith("the API server refused NodeClaim "), condition
    assert (
        f"ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request"
        in (condition["message"])
    )
    assert said in condition["message"]
    assert "RBAC" not in condition["message"]
    assert karpenter.denials.message is None


async def _clean(admin: Kube, control_plane: ControlPlane, namespace: str, pool: str) -> None:
    listed = await admin.list_objects(NODE_CLAIM, label_selector=names.ATTEMPT_LABEL)
    for claim in listed["items"]:
        if claim["metadata"]["labels"].get(names.NODE_POOL_LABEL) == pool:
            with contextlib.suppress(NotFoundError):
                await admin.delete(NODE_CLAIM, claim["metadata"]["name"])
    with contextlib.suppress(NotFoundError):
        await admin.delete(NODE_POOL, pool)
    remove_namespace(control_plane, namespace)


async def _refused_now(admin: Kube, claim: Obj) -> bool:
    """The API server loads policies from informers: whether it refuses a dry-run copy of
    ``claim`` under another name yet."""
    probe = {
        "apiVersion": claim["apiVersion"],
        "kind": claim["kind"],
        "metadata": {
            "name": f"probe-{uuid.uuid4().hex[:8]}",
            "labels": claim["metadata"]["labels"],
            "annotations": claim["metadata"]["annotations"],
        },
        "spec": claim["spec"],
    }
    try:
        await admin.request(
            "POST", NODE_CLAIM.collection_path(None), query={"dryRun": "All"}, body=probe
        )
    except ApiError as e:
        if "denied request" in e.message:
            return True
        raise
    return False


async def _none_left(claims: Any, gang: str, karpenter: KarpenterProvisioner) -> bool:
    """Passes until the gang's claims are withdrawn (none is made: the first is refused)."""
    await karpenter.pass_once()
    return not await claims(gang)


@pytest.mark.timeout(120)
async def test_a_creation_cut_short_is_completed_unless_the_missing_claim_is_refused(
    control_plane: ControlPlane,
    node_pool_crd: None,  # noqa: F811
    claim_crd: None,
) -> None:
    """Two gangs' creations cut short after their first claim (gang a: the first create's
    answer lost on its way back, the pass's serving of a ends there; gang c: its second
    create failing, 500). The next pass, a new process's, makes a's missing claim under
    the attempt's own name and records the creation (NodeClaimsCompleted): nothing is
    withdrawn, the attempt goes on. c's missing claim is refused by a policy installed
    meanwhile (a reason that will not change): c fails NodeClaimRefused quoting it, and its
    claim made is withdrawn. Before, both failed NodeClaimsIncomplete and were rolled back."""
    namespace = f"karp-cut-{uuid.uuid4().hex[:8]}"
    pool = f"pool-{namespace}"
    name = f"deny-{namespace}"
    async with await Kube.connect(str(control_plane.kubeconfig)) as admin:
        await admin.create(NAMESPACE, {"metadata": {"name": namespace}})
        await admin.create(NODE_POOL, node_pool(pool))
        try:
            for gang in ("a", "c"):
                await admin.create(POD_TEMPLATE, template(namespace, gang), namespace)
                await admin.create(PROVISIONING_REQUEST, request(namespace, gang), namespace)
            await asyncio.sleep(1.1)  # claims are made a second after their request
            create = admin.create

            async def cut_short(res: Any, body: Obj, namespace: str | None = None) -> Obj:
                notes = body["metadata"].get("annotations") or {}
                gang, index = notes.get(names.REQUESTED_FOR, ""), notes.get(names.CLAIM_INDEX)
                if res is NODE_CLAIM and gang.endswith("/c-check-1") and index == "1":
                    raise error_from_status(500, "", target="NodeClaim")
                made = await create(res, body, namespace)
                if res is NODE_CLAIM and gang.endswith("/a-check-1") and index == "0":
                    raise error_from_status(504, "", target="NodeClaim")  # answer lost
                return made

            async def claims(gang: str) -> list[Obj]:
                listed = await admin.list_objects(NODE_CLAIM, label_selector=names.ATTEMPT_LABEL)
                key = f"{namespace}/{gang}-check-1"
                return [
                    c
                    for c in listed["items"]
                    if c["metadata"]["annotations"].get(names.REQUESTED_FOR) == key
                ]

            async def conditions(gang: str) -> dict[str, Obj]:
                got = await admin.get(PROVISIONING_REQUEST, f"{gang}-check-1", namespace)
                found = (got.get("status") or {}).get("conditions") or []
                return {c["type"]: c for c in found}

            async with running(admin) as caches:
                with mock.patch.object(admin, "create", cut_short):
                    await KarpenterProvisioner(admin, caches).pass_once()
                cut = {gang: len(await claims(gang)) for gang in ("a", "c")}
                cut_c = await claims("c")
                before = {gang: await conditions(gang) for gang in ("a", "c")}
                with policy(control_plane, name, f"{namespace}/c-check-1", "Forbidden"):
                    await until(lambda: _refused_now(admin, (cut_c or [{}])[0]))
                    karpenter = KarpenterProvisioner(admin, caches)  # a new process
                    await karpenter.pass_once()
                    after = {gang: await conditions(gang) for gang in ("a", "c")}
                    await until(lambda: _none_left(claims, "c", karpenter))
                a_claims = await claims("a")
                uids = {
                    gang: (await admin.get(PROVISIONING_REQUEST, f"{gang}-check-1", namespace))[
                        "metadata"
                    ]["uid"]
                    for gang in ("a", "c")
                }
        finally:
            await _clean(admin, control_plane, namespace, pool)
    assert cut == {"a": 1, "c": 1} and before == {"a": {}, "c": {}}
    accepted = after["a"]["Accepted"]
    assert (accepted["reason"], accepted["message"]) == (
        "NodeClaimsCompleted",
        f"created 2 NodeClaims in NodePool {pool!r}",
    )
    assert "Failed" not in after["a"]
    assert sorted(c["metadata"]["name"] for c in a_claims) == sorted(
        claim_name(pool, f"{namespace}/a-check-1", i, uids["a"]) for i in range(2)
    )
    refused = after["c"]["Failed"]
    assert refused["reason"] == "NodeClaimRefused", refused
    second = claim_name(pool, f"{namespace}/c-check-1", 1, uids["c"])
    assert refused["message"].startswith(f"the API server refused NodeClaim {second!r}: ")
    assert f"ValidatingAdmissionPolicy '{name}'" in refused["message"]
    assert "Accepted" not in after["c"]
