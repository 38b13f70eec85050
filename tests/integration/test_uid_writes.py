"""A merge patch carrying the uid it was decided for (`Kube.merge_patch(uid=...)`) writes only
that object: on one deleted and made again under its name it raises ReplacedError and leaves
the new one as it is. kube-apiserver's own answer is what `replaced` reads (its 422 naming the
immutable metadata.uid): a real API server, a built-in kind and a custom resource."""

from __future__ import annotations

import pytest

from gangcheck.kube.errors import ConflictError, ReplacedError
from gangcheck.kube.resources import PROVISIONING_REQUEST, Resource
from gangcheck.model.objects import Obj
from tests.integration.harness import Cluster

pytestmark = pytest.mark.integration

CONFIG_MAP = Resource("", "v1", "configmaps", "ConfigMap")


def config_map(cluster: Cluster) -> Obj:
    return {"metadata": {"name": "again", "namespace": cluster.ns}, "data": {"made": "first"}}


def provisioning_request(cluster: Cluster) -> Obj:
    return {
        "metadata": {"name": "again", "namespace": cluster.ns},
        "spec": {
            "provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
            "podSets": [{"podTemplateRef": {"name": "again"}, "count": 1}],
        },
    }


@pytest.mark.parametrize("kind", ["ConfigMap", "ProvisioningRequest"])
async def test_a_patch_for_an_object_made_again_since_is_refused_and_changes_nothing(
    cluster: Cluster, kind: str
) -> None:
    res, body = (
        (CONFIG_MAP, config_map(cluster))
        if kind == "ConfigMap"
        else (PROVISIONING_REQUEST, provisioning_request(cluster))
    )
    kube = cluster.kube
    first = await kube.create(res, body, cluster.ns)
    old_uid = first["metadata"]["uid"]
    await kube.delete(res, "again", cluster.ns)
    again = await kube.create(res, body, cluster.ns)
    assert again["metadata"]["uid"] != old_uid
    patch = {"metadata": {"annotations": {"gangcheck.io/said": "for the first"}}}

    with pytest.raises(ReplacedError) as raised:
        await kube.merge_patch(res, "again", patch, cluster.ns, uid=old_uid)
    assert isinstance(raised.value, ConflictError)  # callers that retry conflicts retry it
    live = await kube.get(res, "again", cluster.ns)
    assert live["metadata"]["uid"] == again["metadata"]["uid"]
    assert "gangcheck.io/said" not in (live["metadata"].get("annotations") or {})

    written = await kube.merge_patch(res, "again", patch, cluster.ns, uid=again["metadata"]["uid"])
    assert written["metadata"]["annotations"]["gangcheck.io/said"] == "for the first"
    assert written["metadata"]["uid"] == again["metadata"]["uid"]
