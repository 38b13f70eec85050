"""From a Workload's pod sets to the pod sets of one ProvisioningRequest.

Which pod sets need provisioning (managedResources), which merge into one request pod set
(podSetMergePolicy), and the PodTemplate each request pod set points at: the pod set's
template plus the node labels and tolerations of its assigned ResourceFlavors, with limits
copied into missing requests, as Kueue builds them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gangcheck.logic.attempt.demand import limits_as_missing_requests, scheduling_requirements
from gangcheck.model.names import (
    GANG_REQUIRED_TOPOLOGY_ANNOTATION,
    PROVREQ_ANNOTATION_PREFIX,
    REQUIRED_TOPOLOGY_ANNOTATION,
)
from gangcheck.model.objects import Flavor, Obj, PodSet, Workload
from gangcheck.model.provisioning_config import MergePolicy


@dataclass(frozen=True)
class MergedPodSet:
    """One request pod set: the first member's template, all members' counts added up."""

    name: str
    members: tuple[str, ...]
    count: int
    template: Obj


def _containers(spec: Obj) -> Iterable[Obj]:
    yield from spec.get("initContainers") or []
    yield from spec.get("containers") or []


def uses_any(template: Obj, resources: Iterable[str]) -> bool:
    wanted = set(resources)
    for c in _containers(template.get("spec") or {}):
        res = c.get("resources") or {}
        if wanted & (set(res.get("requests") or {}) | set(res.get("limits") or {})):
            return True
    return False


def required_level(template: Obj) -> str | None:
    """The topology level a pod set's members must share one domain of: Kueue's
    ``podset-required-topology`` on its template, else gangcheck's own form of it (which Kueue
    does not read: it admits the Job on any flavor). Both there: Kueue's, which Kueue enforces."""
    notes = (template.get("metadata") or {}).get("annotations") or {}
    return notes.get(REQUIRED_TOPOLOGY_ANNOTATION) or notes.get(GANG_REQUIRED_TOPOLOGY_ANNOTATION)


def required_pod_sets(workload: Workload, managed_resources: tuple[str, ...]) -> list[PodSet]:
    """Pod sets that need capacity: those with members (`members_now`) using a managed
    resource (all if none is named)."""
    return [
        ps
        for ps in workload.pod_sets
        if members_now(workload, ps) > 0
        and (not managed_resources or uses_any(ps.template, managed_resources))
    ]


def unassigned_pod_sets(workload: Workload, managed_resources: tuple[str, ...]) -> list[str]:
    """Pod sets that need capacity but that the admission has no assignment for: an
    inconsistent admission (Kueue stops with errInconsistentPodSetAssignments). An admission
    with no assignment at all is inconsistent too; no admission yet is not."""
    if workload.assignments is None:
        return []
    return [
        ps.name
        for ps in workload.pod_sets
        if ps.count > 0
        and workload.assignment(ps.name) is None
        and (not managed_resources or uses_any(ps.template, managed_resources))
    ]


def admitted_count(workload: Workload, pod_set: PodSet) -> int:
    assignment = workload.assignment(pod_set.name)
    if assignment is not None and assignment.count is not None:
        return assignment.count
    return pod_set.count


def members_now(workload: Workload, pod_set: PodSet) -> int:
    """A pod set's members as Kueue's quota counts them: what its admission assigned, within
    the Job's count now. Kueue v0.17 scales an elastic Job's admitted Workload down by
    lowering its spec's count in place (`EnsureWorkloadSlices`, a plain Update: the
    admission's count stays) and counts the lower of the two (`totalRequestsFromAdmission`);
    the Job controller deletes the members beyond it."""
    return min(admitted_count(workload, pod_set), pod_set.count)


def merge_pod_sets(
    workload: Workload, pod_sets: list[PodSet], policy: MergePolicy | None
) -> list[MergedPodSet]:
    merged: list[MergedPodSet] = []
    for ps in pod_sets:
        count = members_now(workload, ps)  # an elastic Job scaled down since: what it has
        for i, group in enumerate(merged):
            first = next(p for p in pod_sets if p.name == group.name)
            if policy is not None and can_merge(first, ps, policy):
                merged[i] = MergedPodSet(
                    group.name, (*group.members, ps.name), group.count + count, group.template
                )
                break
        else:
            merged.append(MergedPodSet(ps.name, (ps.name,), count, ps.template))
    return merged


def can_merge(a: PodSet, b: PodSet, policy: MergePolicy) -> bool:
    if policy is MergePolicy.IDENTICAL_POD_TEMPLATES:
        return a.template == b.template
    return scheduling_requirements(a.template) == scheduling_requirements(b.template)


def pod_template_spec(
    workload: Workload,
    pod_set_name: str,
    template: Obj,
    flavors: Mapping[str, Flavor],
    *,
    pinned: Mapping[str, str] | None = None,
) -> Obj:
    """The pod set's template with its flavors' node labels and tolerations merged in, and
    the node labels of the capacity source asked (`pinned`)."""
    out = copy.deepcopy(template)
    spec = out.setdefault("spec", {})
    for flavor_name in sorted(assigned_flavors(workload, pod_set_name)):
        flavor = flavors.get(flavor_name)
        if flavor is None:
            continue
        spec["nodeSelector"] = {**flavor.node_labels, **(spec.get("nodeSelector") or {})}
        existing = spec.setdefault("tolerations", [])
        existing.extend(t for t in flavor.tolerations if t not in existing)
    if pinned:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **pinned}
    for container in _containers(spec):
        limits_as_missing_requests(container)
    return out


def assigned_flavors(workload: Workload, pod_set_name: str) -> set[str]:
    assignment = workload.assignment(pod_set_name)
    return set(assignment.flavors.values()) if assignment else set()


def missing_flavors(
    workload: Workload, pod_sets: list[PodSet], flavors: Mapping[str, Flavor]
) -> list[str]:
    """Flavors the admission names that are not (or no longer) in the cluster."""
    names = set().union(*(assigned_flavors(workload, ps.name) for ps in pod_sets))
    return sorted(names - set(flavors))


def request_parameters(
    config_parameters: Mapping[str, str], annotations: Mapping[str, str]
) -> dict[str, str]:
    """Config parameters overlaid by the Workload's provreq.kueue.x-k8s.io/KEY annotations."""
    params = dict(config_parameters)
    for key, value in annotations.items():
        if key.startswith(PROVREQ_ANNOTATION_PREFIX):
            params[key.removeprefix(PROVREQ_ANNOTATION_PREFIX)] = value
    return params
