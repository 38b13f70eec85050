"""Karpenter's side of the test bed: its instance types, its KWOKNodeClass and its NodePools.

Karpenter's kwok cloud provider turns every NodeClaim into a Node annotated
``kwok.x-k8s.io/node: fake`` (kwok then makes it Ready). Which machines it can launch comes from
an instance-types file (``--instance-types-file-path``): :class:`InstanceType` writes one entry
of it. What Karpenter may launch for pending pods comes from NodePools: :class:`NodePool` builds
one, pointing at the single KWOKNodeClass :func:`node_class` builds.

The CRDs (NodePool, NodeClaim, NodeOverlay, CapacityBuffer from ``kwok/charts/crds/``,
KWOKNodeClass from ``kwok/apis/crds/``) are read from the pinned module in the Go module cache
when the stack starts Karpenter, never copied into the repository.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gangcheck_dev.testbed.nodes import GPU_RESOURCE, Taint

KARPENTER_MODULE = "sigs.k8s.io/karpenter"
#: Karpenter v1.15 needs Go >= 1.26.9 (``hack/build.sh`` uses the same toolchain).
KARPENTER_TOOLCHAIN = "go1.27.3"
#: Folders of the module holding the CRDs the kwok provider needs.
CRD_FOLDERS = ("kwok/charts/crds", "kwok/apis/crds")
NODE_POOLS = "/apis/karpenter.sh/v1/nodepools"
NODE_CLAIMS = "/apis/karpenter.sh/v1/nodeclaims"
NODE_CLASSES = "/apis/karpenter.kwok.sh/v1alpha1/kwoknodeclasses"
NODE_CLASS_NAME = "default"
NODE_POOL_LABEL = "karpenter.sh/nodepool"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
ZONES = ("test-zone-a",)


@dataclass(frozen=True)
class InstanceType:
    """One machine the kwok provider can launch, offered on demand in ``zones``."""

    name: str
    cpu: str = "32"
    memory: str = "256Gi"
    gpus: int = 0
    pods: int = 110
    price: float = 1.0
    zones: Sequence[str] = ZONES

    def resources(self) -> dict[str, str]:
        resources = {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": str(self.pods),
            "ephemeral-storage": "100Gi",
        }
        if self.gpus:
            resources[GPU_RESOURCE] = str(self.gpus)
        return resources

    def to_dict(self) -> dict[str, Any]:
        """The entry of the kwok provider's instance-types file."""
        return {
            "name": self.name,
            "offerings": [_offering(zone, self.price) for zone in self.zones],
            "architecture": "amd64",
            "operatingSystems": ["linux"],
            "resources": self.resources(),
        }


def _offering(zone: str, price: float) -> dict[str, Any]:
    return {
        "Price": price,
        "Available": True,
        "Requirements": [
            {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand"]},
            {"key": ZONE_LABEL, "operator": "In", "values": [zone]},
        ],
    }


#: An 8-GPU machine, and a CPU one for everything else.
GPU_8X = InstanceType("gpu-8x-amd64-linux", cpu="32", memory="256Gi", gpus=8, price=32.0)
CPU_4X = InstanceType("c-4x-amd64-linux", cpu="4", memory="16Gi", price=0.2)
DEFAULT_INSTANCE_TYPES = (GPU_8X, CPU_4X)


def write_instance_types(path: Path, instance_types: Sequence[InstanceType]) -> Path:
    names = [t.name for t in instance_types]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"instance types need distinct names, at least one: {names}")
    path.write_text(json.dumps([t.to_dict() for t in instance_types], indent=1))
    return path


@dataclass(frozen=True)
class NodePool:
    """A NodePool of the kwok provider, limited to ``instance_types`` (names).

    ``limits``: resource limits of the pool (``{"nvidia.com/gpu": "24"}``, ``{"nodes": "3"}``).
    ``consolidation``: ``WhenEmpty``, ``WhenEmptyOrUnderutilized`` or ``None`` for never
    (``consolidateAfter: Never``). ``labels`` and ``taints`` go onto every node it launches.
    """

    name: str
    instance_types: Sequence[str] = (GPU_8X.name,)
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Taint] = ()
    limits: Mapping[str, str] = field(default_factory=dict)
    consolidation: str | None = "WhenEmpty"
    consolidate_after: str = "10s"

    def to_dict(self) -> dict[str, Any]:
        disruption: dict[str, Any] = {"consolidateAfter": "Never"}
        if self.consolidation is not None:
            disruption = {
                "consolidationPolicy": self.consolidation,
                "consolidateAfter": self.consolidate_after,
            }
        spec: dict[str, Any] = {
            "template": {
                "metadata": {"labels": dict(self.labels)},
                "spec": {
                    "nodeClassRef": {
                        "group": "karpenter.kwok.sh",
                        "kind": "KWOKNodeClass",
                        "name": NODE_CLASS_NAME,
                    },
                    "requirements": [
                        {
                            "key": INSTANCE_TYPE_LABEL,
                            "operator": "In",
                            "values": list(self.instance_types),
                        }
                    ],
                    "taints": [t.to_dict() for t in self.taints],
                    "expireAfter": "Never",
                },
            },
            "disruption": disruption,
        }
        if self.limits:
            spec["limits"] = dict(self.limits)
        return {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodePool",
            "metadata": {"name": self.name},
            "spec": spec,
        }


def node_class() -> dict[str, Any]:
    """The one KWOKNodeClass every NodePool of the test bed points at (nodes register at once)."""
    return {
        "apiVersion": "karpenter.kwok.sh/v1alpha1",
        "kind": "KWOKNodeClass",
        "metadata": {"name": NODE_CLASS_NAME},
        "spec": {},
    }
