"""PodGroups, whichever API declares them, seen the one way the provisioner needs.

- upstream ``scheduling.k8s.io`` (v1beta1 on 1.37 with GenericWorkload on; v1alpha2 on 1.36):
  gang size ``spec.schedulingPolicy.gang.minCount`` (a ``basic`` policy is no gang),
  a required topology ``spec.schedulingConstraints.topology[0].key``; pods join with
  ``spec.schedulingGroup.podGroupName``.
- scheduler-plugins ``scheduling.x-k8s.io/v1alpha1``: gang size ``spec.minMember``; pods join
  with the label ``scheduling.x-k8s.io/pod-group``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gangcheck.model.objects import ObjectRef, ReadOnlyObj, ref_of

UPSTREAM = "scheduling.k8s.io"
PLUGINS = "scheduling.x-k8s.io"
PLUGINS_LABEL = "scheduling.x-k8s.io/pod-group"
SHORT = {UPSTREAM: "pg", PLUGINS: "coscheduling"}
"""A short word per API, in request names and queue keys: the two kinds may share names."""


@dataclass(frozen=True)
class PodGroup:
    ref: ObjectRef
    api_group: str
    resource_version: str
    min_count: int
    """Members the gang needs; 0 when the group is not a gang (upstream basic policy)."""
    topology_key: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)
    deleting: bool = False
    problem: str = ""
    """Why the group cannot be provisioned as declared (a malformed gang size)."""

    @property
    def short(self) -> str:
        return SHORT.get(self.api_group, "pg")

    @property
    def is_gang(self) -> bool:
        return self.min_count > 0


def pod_group_of(obj: ReadOnlyObj) -> PodGroup:
    """The view of a PodGroup object of either API (told apart by its apiVersion)."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    api_version = str(obj.get("apiVersion") or "")
    group = api_version.split("/", 1)[0] if "/" in api_version else ""
    if group == PLUGINS:
        min_count, problem, topology = _plugins_size(spec), "", ""
    else:
        group = UPSTREAM
        min_count, problem = _upstream_size(spec)
        topology = _upstream_topology(spec)
    return PodGroup(
        ref=replace(ref_of(obj), kind="PodGroup"),
        api_group=group,
        resource_version=str(meta.get("resourceVersion") or ""),
        min_count=min_count,
        topology_key=topology,
        annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
        deleting=bool(meta.get("deletionTimestamp")),
        problem=problem,
    )


def _upstream_size(spec: ReadOnlyObj) -> tuple[int, str]:
    policy = spec.get("schedulingPolicy") or {}
    gang = policy.get("gang")
    if not isinstance(gang, Mapping):
        return 0, ""
    count = gang.get("minCount")
    if not isinstance(count, int) or count < 1:
        return 0, f"schedulingPolicy.gang.minCount {count!r} is not a positive integer"
    return count, ""


def _upstream_topology(spec: ReadOnlyObj) -> str:
    topology = (spec.get("schedulingConstraints") or {}).get("topology") or []
    first = topology[0] if topology and isinstance(topology[0], Mapping) else {}
    return str(first.get("key") or "")


def _plugins_size(spec: ReadOnlyObj) -> int:
    count = spec.get("minMember")
    return count if isinstance(count, int) and count > 0 else 0
