"""Odd objects a new user writes: each is told once, where the user looks, and the
controller goes on serving the rest (the house rule: docs/troubleshooting.md)."""

from __future__ import annotations

from typing import Any

import pytest

from gangcheck.model.provisioning_config import parse_spec

# ---- AtomicProvisioningConfig: labels gangcheck writes, refused as the config's problem ----


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        (
            {"capacitySources": [{"nodeSelector": {"bad key": "a"}}]},
            "spec.capacitySources[0].nodeSelector: 'bad key' is not a label key",
        ),
        (
            {"capacitySources": [{}, {"nodeSelector": {"pool": "has space"}}]},
            "spec.capacitySources[1].nodeSelector: 'has space' is not a label value",
        ),
        (
            {"capacitySources": [{"nodeSelector": {"pool": "x" * 64}}]},
            "spec.capacitySources[0].nodeSelector: 'xxxx",
        ),
        (
            {"capacitySources": [{"nodeSelector": {"-a.io/b": "c"}}]},
            "spec.capacitySources[0].nodeSelector: '-a.io/b' has no valid prefix",
        ),
        (
            {
                "podSetUpdates": {
                    "nodeSelector": [{"key": "my key", "valueFromProvisioningClassDetail": "d"}]
                }
            },
            "spec.podSetUpdates.nodeSelector[0].key: 'my key' is not a label key",
        ),
        (
            {
                "backend": "Karpenter",
                "fulfillment": {"reclaimer": "DeleteNodeClaim"},
                "karpenter": {"nodePools": ["a,b"]},
            },
            "spec.karpenter.nodePools[0]: 'a,b' is not a NodePool name",
        ),
        (
            {
                "capacitySources": [{"karpenter": {"nodePools": ["gpu", "Big Pool"]}}],
                "fulfillment": {"reclaimer": "DeleteNodeClaim"},
            },
            "spec.capacitySources[0].karpenter.nodePools[1]: 'Big Pool' is not a NodePool name",
        ),
    ],
)
def test_a_config_naming_labels_the_api_server_refuses_is_invalid(
    spec: dict[str, Any], names: str
) -> None:
    """Labels a config has gangcheck write (a source's pins on the request's pod templates
    and on the gang's podSetUpdates, the podSetUpdates keys it fills from the class
    details) must be labels: else every gang under the config met a refused write (the
    PodTemplate's, or Kueue's webhook refusing the check's podSetUpdates) and retried,
    the config itself Active. A NodePool name joins a comma-separated parameter."""
    with pytest.raises(ValueError) as refused:
        parse_spec(spec)
    assert names in str(refused.value)


@pytest.mark.parametrize(
    "spec",
    [
        {"capacitySources": [{"nodeSelector": {"cloud.google.com/gke-nodepool": "a-1_b.c"}}]},
        {"capacitySources": [{"nodeSelector": {"pool": ""}}]},
        {
            "podSetUpdates": {
                "nodeSelector": [
                    {
                        "key": "cloud.google.com/reservation-name",
                        "valueFromProvisioningClassDetail": "r",
                    }
                ]
            }
        },
        {
            "backend": "Karpenter",
            "fulfillment": {"reclaimer": "DeleteNodeClaim"},
            "karpenter": {"nodePools": ["gpu.a100", "b-2"]},
        },
    ],
)
def test_labels_and_pool_names_kubernetes_takes_are_taken(spec: dict[str, Any]) -> None:
    parse_spec(spec)
