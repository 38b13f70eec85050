"""A NodeClaim the real API server refuses for what it is, on a kube-apiserver serving
Karpenter's own NodePool and NodeClaim CRDs (from the module the test bed pins): a
ValidatingAdmissionPolicy denying one gang's claims. That gang's request fails quoting the
policy (not "the Karpenter backend's RBAC is not installed", though the policy may answer
403), none of its claims is left, and the other gang of the same pass gets its claims. (Before:
the 403 was told as missing RBAC and every pass backed off; the 422 ended each pass, the other
gang never served.)"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError, error_from_status
from gangcheck.kube.resources import NODE_CLAIM, PROVISIONING_REQUEST
from gangcheck.logic.sources.karpenter import names
from gangcheck.logic.sources.karpenter.claims import claim_name
from gangcheck.reconcile.karpenter import KarpenterProvisioner
from tests.integration.harness import apply, deny_policy, eventually
from tests.integration.karpenter_bed import Bed, karpenter_bed, running

pytestmark = pytest.mark.integration
Obj = dict[str, Any]


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


@pytest.mark.timeout(120)
@pytest.mark.parametrize("reason", ["Forbidden", ""], ids=["403", "default-reason"])
async def test_a_claim_a_policy_refuses_fails_only_its_gang_quoting_the_policy(
    control_plane: ControlPlane, node_pool_crd: None, claim_crd: None, reason: str
) -> None:
    async with karpenter_bed(control_plane, "karp-refused") as bed:
        name = f"deny-{bed.namespace}"
        with policy(control_plane, name, bed.key("a"), reason) as said:
            await bed.add_gangs("a", "b")

            async def failed() -> Obj | None:
                return (await bed.conditions("a")).get("Failed")

            async with running(bed.admin) as caches:
                karpenter = KarpenterProvisioner(bed.admin, caches)
                await karpenter.pass_once()
                made_for_b = await bed.claims("b")
                condition = await eventually(failed, what="gang a's Failed condition")
                await eventually(
                    lambda: _none_left(bed, "a", karpenter), what="gang a's claims withdrawn"
                )
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


async def _none_left(bed: Bed, gang: str, karpenter: KarpenterProvisioner) -> bool:
    """Passes until the gang's claims are withdrawn (none is made: the first is refused)."""
    await karpenter.pass_once()
    return not await bed.claims(gang)


@pytest.mark.timeout(120)
async def test_a_creation_cut_short_is_completed_unless_the_missing_claim_is_refused(
    control_plane: ControlPlane, node_pool_crd: None, claim_crd: None
) -> None:
    """Two gangs' creations cut short after their first claim (gang a: the first create's
    answer lost on its way back, the pass's serving of a ends there; gang c: its second
    create failing, 500). The next pass, a new process's, makes a's missing claim under
    the attempt's own name and records the creation (NodeClaimsCompleted): nothing is
    withdrawn, the attempt goes on. c's missing claim is refused by a policy installed
    meanwhile (a reason that will not change): c fails NodeClaimRefused quoting it, and its
    claim made is withdrawn. Before, both failed NodeClaimsIncomplete and were rolled back."""
    async with karpenter_bed(control_plane, "karp-cut", "a", "c") as bed:
        admin, namespace, pool = bed.admin, bed.namespace, bed.pool
        name = f"deny-{namespace}"
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

        async with running(admin) as caches:
            with mock.patch.object(admin, "create", cut_short):
                await KarpenterProvisioner(admin, caches).pass_once()
            cut = {gang: len(await bed.claims(gang)) for gang in ("a", "c")}
            cut_c = await bed.claims("c")
            before = {gang: await bed.conditions(gang) for gang in ("a", "c")}
            with policy(control_plane, name, bed.key("c"), "Forbidden"):
                await eventually(
                    lambda: _refused_now(admin, (cut_c or [{}])[0]), what="the deny policy enforced"
                )
                karpenter = KarpenterProvisioner(admin, caches)  # a new process
                await karpenter.pass_once()
                after = {gang: await bed.conditions(gang) for gang in ("a", "c")}
                await eventually(
                    lambda: _none_left(bed, "c", karpenter), what="gang c's claims withdrawn"
                )
            a_claims = await bed.claims("a")
            uids = {
                gang: (await admin.get(PROVISIONING_REQUEST, f"{gang}-check-1", namespace))[
                    "metadata"
                ]["uid"]
                for gang in ("a", "c")
            }
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
