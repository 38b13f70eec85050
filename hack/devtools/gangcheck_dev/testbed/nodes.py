"""Fake nodes of the test bed: kwok Nodes and cluster-autoscaler's kwok node groups.

kwok manages every Node annotated ``kwok.x-k8s.io/node: fake`` (it makes it Ready, renews its
lease and runs its pods). :func:`kwok_node` builds such a Node for a test to create;
:class:`NodeGroup` describes one node group of cluster-autoscaler's kwok provider, which
creates these Nodes itself when it scales up. Node groups are read once, when
cluster-autoscaler starts, from two ConfigMaps built by :func:`autoscaler_configmaps`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

#: The annotation kwok selects the Nodes it manages by (``--manage-nodes-with-annotation-...``).
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
#: The label cluster-autoscaler's kwok provider groups nodes by (``fromNodeLabelKey``).
NODE_GROUP_LABEL = "gangcheck.io/nodegroup"
GPU_RESOURCE = "nvidia.com/gpu"
MIN_COUNT_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/min-count"
MAX_COUNT_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/max-count"
PROVIDER_CONFIGMAP = "kwok-provider-config"
TEMPLATES_CONFIGMAP = "kwok-provider-templates"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def __post_init__(self) -> None:
        if self.effect not in TAINT_EFFECTS:
            raise ValueError(f"taint {self.key}: effect must be one of {TAINT_EFFECTS}")

    @classmethod
    def parse(cls, text: str) -> Taint:
        """``key[=value]:Effect`` as kubectl writes it (``Effect`` defaults to NoSchedule)."""
        body, _, effect = text.partition(":")
        key, _, value = body.partition("=")
        return cls(key=key, value=value, effect=effect or "NoSchedule")

    def to_dict(self) -> dict[str, str]:
        taint = {"key": self.key, "effect": self.effect}
        if self.value:
            taint["value"] = self.value
        return taint

    def toleration(self) -> dict[str, str]:
        """The toleration a pod needs to land on a node with this taint."""
        if self.value:
            return {
                "key": self.key,
                "operator": "Equal",
                "value": self.value,
                "effect": self.effect,
            }
        return {"key": self.key, "operator": "Exists", "effect": self.effect}


def _resources(cpu: str, memory: str, gpus: int, pods: int) -> dict[str, str]:
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods), "ephemeral-storage": "100Gi"}
    if gpus:
        resources[GPU_RESOURCE] = str(gpus)
    return resources


def kwok_node(
    name: str,
    *,
    cpu: str = "32",
    memory: str = "256Gi",
    gpus: int = 0,
    pods: int = 110,
    labels: Mapping[str, str] | None = None,
    taints: Iterable[Taint] = (),
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Node that kwok manages: create it and kwok makes it Ready within a second or so."""
    all_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        **(labels or {}),
    }
    resources = _resources(cpu, memory, gpus, pods)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": all_labels,
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE, **(annotations or {})},
        },
        "spec": {"taints": [t.to_dict() for t in taints]},
        "status": {"allocatable": dict(resources), "capacity": dict(resources)},
    }


@dataclass(frozen=True)
class NodeGroup:
    """One node group of cluster-autoscaler's kwok provider.

    Its nodes carry ``labels`` plus ``gangcheck.io/nodegroup: <name>``, the ``taints``, and
    ``cpu``/``memory``/``gpus`` (``nvidia.com/gpu``) as allocatable and capacity.
    """

    name: str
    max: int
    cpu: str = "32"
    memory: str = "256Gi"
    gpus: int = 0
    pods: int = 110
    min: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Taint] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.min <= self.max:
            raise ValueError(f"node group {self.name}: need 0 <= min <= max")

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> NodeGroup:
        """From YAML/JSON: ``{name, max, min?, cpu?, memory?, gpus?, pods?, labels?, taints?}``;
        a taint is ``"key=value:Effect"`` or ``{key, value?, effect?}``."""
        known = {"name", "max", "min", "cpu", "memory", "gpus", "pods", "labels", "taints"}
        unknown = set(spec) - known
        if unknown:
            raise ValueError(f"node group {spec.get('name')!r}: unknown keys {sorted(unknown)}")
        taints = tuple(
            Taint.parse(t) if isinstance(t, str) else Taint(**t) for t in spec.get("taints", ())
        )
        return cls(
            name=str(spec["name"]),
            max=int(spec["max"]),
            min=int(spec.get("min", 0)),
            cpu=str(spec.get("cpu", "32")),
            memory=str(spec.get("memory", "256Gi")),
            gpus=int(spec.get("gpus", 0)),
            pods=int(spec.get("pods", 110)),
            labels={str(k): str(v) for k, v in (spec.get("labels") or {}).items()},
            taints=taints,
        )

    @property
    def node_labels(self) -> dict[str, str]:
        return {
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": "kwok",
            **self.labels,
            NODE_GROUP_LABEL: self.name,
        }

    def template(self) -> dict[str, Any]:
        """The template Node the kwok provider clones (annotations must not be null: the
        provider writes into them and panics on a nil map)."""
        resources = _resources(self.cpu, self.memory, self.gpus, self.pods)
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": self.node_labels,
                "annotations": {
                    MIN_COUNT_ANNOTATION: str(self.min),
                    MAX_COUNT_ANNOTATION: str(self.max),
                },
            },
            "spec": {"taints": [t.to_dict() for t in self.taints]},
            "status": {"allocatable": dict(resources), "capacity": dict(resources)},
        }


def autoscaler_configmaps(
    node_groups: Sequence[NodeGroup], namespace: str = "kube-system"
) -> list[dict[str, Any]]:
    """The provider config and the node templates the kwok provider reads at start."""
    names = [g.name for g in node_groups]
    if len(set(names)) != len(names):
        raise ValueError(f"node group names must be unique: {names}")
    config = {
        "apiVersion": "v1alpha1",
        "readNodesFrom": "configmap",
        "nodegroups": {"fromNodeLabelKey": NODE_GROUP_LABEL},
        # Our templates carry the taints they want; the provider would add its own otherwise.
        "nodes": {"skipTaint": True},
        "configmap": {"name": TEMPLATES_CONFIGMAP},
    }
    templates = {"apiVersion": "v1", "kind": "List", "items": [g.template() for g in node_groups]}
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": PROVIDER_CONFIGMAP, "namespace": namespace},
            "data": {"config": yaml.safe_dump(config, sort_keys=False)},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": TEMPLATES_CONFIGMAP, "namespace": namespace},
            "data": {"templates": yaml.safe_dump(templates, sort_keys=False)},
        },
    ]


def load_node_groups(data: Any) -> list[NodeGroup]:
    """Node groups from parsed YAML/JSON: a list of specs, or ``{nodeGroups: [...]}``."""
    if isinstance(data, Mapping):
        data = data.get("nodeGroups", data.get("node_groups"))
    if not isinstance(data, list):
        raise ValueError("expected a list of node groups (or a mapping with key nodeGroups)")
    return [NodeGroup.from_dict(spec) for spec in data]


#: What ``python -m gangcheck_dev.testbed up --stack full`` starts with unless told otherwise.
DEFAULT_NODE_GROUPS = (
    NodeGroup(name="cpu", max=10, cpu="32", memory="128Gi"),
    NodeGroup(
        name="gpu-a100",
        max=8,
        cpu="96",
        memory="1Ti",
        gpus=8,
        labels={"gangcheck.io/gpu-type": "a100"},
        taints=(Taint(GPU_RESOURCE, "present", "NoSchedule"),),
    ),
)
