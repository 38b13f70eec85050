"""AtomicProvisioningConfigs as a platform engineer writes them, against a real kube-apiserver
serving our CRD (manifests/crd): what the API server refuses at once, naming the field; what
it accepts and gangcheck refuses (the AdmissionCheck Active=False, naming the field); and the
shipped example as the server stores it (its defaults filled in) read by the model.

docs/configure.md says which bad input is refused where; this file holds it to that."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import InvalidError
from gangcheck.kube.resources import ATOMIC_CONFIG
from gangcheck.model.provisioning_config import AtomicProvisioningSpec, parse_spec
from tests.integration.harness import Cluster, RunningController, eventually

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).parents[2] / "manifests" / "examples" / "gpu"
POOL_A, POOL_B = {"pool": "a"}, {"pool": "b"}


async def _refusal(kube: Kube, name: str, spec: dict[str, Any]) -> str:
    """The API server's answer to creating a config with `spec` (it must refuse it)."""
    try:
        await kube.create(ATOMIC_CONFIG, {"metadata": {"name": name}, "spec": spec})
    except InvalidError as refused:
        return str(refused)
    await kube.delete(ATOMIC_CONFIG, name)
    raise AssertionError(f"the API server accepted {spec}")


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"capacitySources": []}, "spec.capacitySources"),
        ({"capacitySources": [{}] * 9}, "spec.capacitySources"),
        (
            {"capacitySources": [{}], "capacitySourcePolicy": "Sideways"},
            "spec.capacitySourcePolicy",
        ),
        ({"capacitySources": [{}, {}], "raceWidth": 9}, "spec.raceWidth"),
        ({"capacitySources": [{"name": ""}]}, "spec.capacitySources[0].name"),
        ({"fulfillment": {"reclaimer": "Shred"}}, "spec.fulfillment.reclaimer"),
        ({"fulfillment": {"deadlineSeconds": 0}}, "spec.fulfillment.deadlineSeconds"),
        (
            {"retryStrategy": {"backoffBaseSeconds": 120, "backoffMaxSeconds": 60}},
            "spec.retryStrategy",
        ),
        ({"karpenter": {"nodePools": []}, "backend": "Karpenter"}, "spec.karpenter.nodePools"),
        ({"provisioningClassName": "Not A Class"}, "spec.provisioningClassName"),
    ],
)
async def test_the_api_server_refuses_what_the_schema_says_naming_the_field(
    kube: Kube, spec: dict[str, Any], field: str
) -> None:
    answer = await _refusal(kube, "schema-refused", spec)
    assert field in answer, answer
    if spec == {"capacitySources": []}:  # as docs/configure.md quotes it
        assert "spec.capacitySources in body should have at least 1 items" in answer
    # and the model, the second line, refuses it too (a config stored before the schema)
    with pytest.raises(ValueError):
        parse_spec(spec)


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        (
            {"capacitySources": [{}, {"provisioningClassName": "nobody.example.com"}]},
            "spec.capacitySources[1].provisioningClassName: 'nobody.example.com' is not a class",
        ),
        (
            {
                "capacitySources": [{"nodeSelector": POOL_A}, {"nodeSelector": {"zone": "z"}}],
                "capacitySourcePolicy": "Race",
            },
            "spec.capacitySources[1].nodeSelector: its nodes cannot be told apart from "
            "spec.capacitySources[0]'s",
        ),
        (
            {
                "capacitySources": [{"nodeSelector": POOL_A}, {"nodeSelector": POOL_B}],
                "capacitySourcePolicy": "Race",
                "raceWidth": 3,
            },
            "spec.raceWidth: 3 sources at once, but spec.capacitySources lists 2",
        ),
        (
            {"capacitySources": [{"name": "a"}, {"name": "a"}]},
            "spec.capacitySources[1].name: 'a' names an earlier source too",
        ),
    ],
)
async def test_what_the_server_accepts_and_gangcheck_refuses_turns_the_check_inactive(
    cluster: Cluster, controller: RunningController, spec: dict[str, Any], names: str
) -> None:
    await cluster.install_check(spec)

    async def inactive() -> Any:
        cond = await cluster.active_condition()
        return cond if cond and cond["reason"] == "InvalidConfig" else None

    cond = await eventually(inactive, what="Active=False InvalidConfig")
    assert cond["status"] == "False"
    assert names in cond["message"], cond["message"]
    await cluster.kube.delete(ATOMIC_CONFIG, cluster.config)


async def test_the_example_config_is_stored_with_the_models_defaults(kube: Kube) -> None:
    [example] = yaml.safe_load_all((EXAMPLE / "atomicprovisioningconfig.yaml").read_text())
    stored = await kube.create(
        ATOMIC_CONFIG, {"metadata": {"name": "schema-example"}, "spec": example["spec"]}
    )
    try:
        assert parse_spec(stored["spec"]) == parse_spec(example["spec"])
        empty = await kube.create(ATOMIC_CONFIG, {"metadata": {"name": "schema-empty"}})
        await kube.delete(ATOMIC_CONFIG, "schema-empty")
        # what the server fills in is what the model assumes when a field is left out
        defaults = AtomicProvisioningSpec().model_dump(by_alias=True, mode="json")
        for key, value in empty["spec"].items():
            assert defaults[key] == value, key
    finally:
        await kube.delete(ATOMIC_CONFIG, "schema-example")
