"""Which pods belong to a PodGroup, and the JSON patch that holds one back from scheduling.

gangcheck provisions capacity for a whole gang before any of its pods may be scheduled. The
mutating webhook (gangcheck/webhook.py) adds the scheduling gate ``GATE`` to every member pod
as it is created, so that neither kube-scheduler nor cluster-autoscaler acts on members one by
one; the controller later lifts the gate from all members together. The webhook also records
when it gated a pod (annotation ``GATED_AT``).

A pod is a member of a PodGroup when either

* ``spec.schedulingGroup.podGroupName`` names one (scheduling.k8s.io PodGroups,
  Kubernetes 1.36+), or
* it carries the scheduler-plugins coscheduling label ``scheduling.x-k8s.io/pod-group``.

Pure: no I/O, no clock of its own (the caller passes the time).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

from gangcheck.logic.attempt.hold import ARRIVING_TAINT, HOLD_TAINT
from gangcheck.logic.timefmt import format_time, parse_time
from gangcheck.model.names import GATE, GATED_AT, RELEASED_BY_ANNOTATION
from gangcheck.model.objects import controlled_by_daemonset, json_pointer, scheduling_gates

OPT_IN_VALUE = "enabled"

#: API group of upstream PodGroups, named by ``spec.schedulingGroup.podGroupName``.
UPSTREAM = "scheduling.k8s.io"
#: API group of scheduler-plugins' coscheduling PodGroups, named by ``COSCHEDULING_LABEL``.
COSCHEDULING = "scheduling.x-k8s.io"
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"

JsonPatch = list[dict[str, Any]]


class PodGroupRef(NamedTuple):
    """The PodGroup a pod names: its API group (``UPSTREAM`` or ``COSCHEDULING``) and name,
    in the pod's own namespace. Compares equal to the plain tuple ``(api_group, name)``."""

    api_group: str
    name: str


def _mapping(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def group_of(pod: Mapping[str, Any]) -> PodGroupRef | None:
    """The PodGroup the pod belongs to, or None when it is no member of one.

    ``spec.schedulingGroup.podGroupName`` wins over the coscheduling label when a pod has
    both: it is the one kube-scheduler itself acts on.
    """
    spec = _mapping(pod.get("spec")) or {}
    scheduling_group = _mapping(spec.get("schedulingGroup")) or {}
    upstream = scheduling_group.get("podGroupName")
    if isinstance(upstream, str) and upstream:
        return PodGroupRef(UPSTREAM, upstream)
    metadata = _mapping(pod.get("metadata")) or {}
    labels = _mapping(metadata.get("labels")) or {}
    coscheduling = labels.get(COSCHEDULING_LABEL)
    if isinstance(coscheduling, str) and coscheduling:
        return PodGroupRef(COSCHEDULING, coscheduling)
    return None


def _gates(spec: Mapping[str, Any]) -> list[Any] | None:
    gates = spec.get("schedulingGates")
    return gates if isinstance(gates, list) else None


def is_gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod (as the API sends it) still carries gangcheck's scheduling gate."""
    return GATE in scheduling_gates(pod)


def gated_at(pod: Mapping[str, Any]) -> datetime | None:
    """When the webhook gated the pod (its ``GATED_AT`` annotation); None when not recorded."""
    metadata = _mapping(pod.get("metadata")) or {}
    annotations = _mapping(metadata.get("annotations")) or {}
    raw = annotations.get(GATED_AT)
    return parse_time(raw) if isinstance(raw, str) else None


def released_by(pod: Mapping[str, Any]) -> str:
    """The reason gangcheck lifted the pod's gate with (its ``RELEASED_BY_ANNOTATION``), ""
    when no release of gangcheck's is recorded on it: gated still, ungated by someone else
    (or never gated), or released by a version that did not record it."""
    metadata = _mapping(pod.get("metadata")) or {}
    annotations = _mapping(metadata.get("annotations")) or {}
    raw = annotations.get(RELEASED_BY_ANNOTATION)
    return raw if isinstance(raw, str) else ""


def gate_patch(pod: Mapping[str, Any], *, now: datetime) -> JsonPatch | None:
    """JSON patch operations (RFC 6902) that add ``GATE`` and the ``GATED_AT`` annotation
    (``now``) to a pod being created; None when the pod needs none:

    * it is no member of a PodGroup,
    * it already carries the gate (the webhook may be invoked again for the same pod),
    * it is already bound (``spec.nodeName`` set: the API refuses gates on bound pods),
    * it has no ``spec`` object to patch.
    """
    spec = _mapping(pod.get("spec"))
    if spec is None or group_of(pod) is None or spec.get("nodeName") or is_gated(pod):
        return None
    gate = {"name": GATE}
    ops: JsonPatch = []
    if _gates(spec) is None:
        ops.append({"op": "add", "path": "/spec/schedulingGates", "value": [gate]})
    else:
        ops.append({"op": "add", "path": "/spec/schedulingGates/-", "value": gate})
    stamp = format_time(now)
    metadata = _mapping(pod.get("metadata"))
    if metadata is None:
        ops.append({"op": "add", "path": "/metadata", "value": {"annotations": {GATED_AT: stamp}}})
    elif _mapping(metadata.get("annotations")) is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {GATED_AT: stamp}})
    else:
        path = json_pointer("metadata", "annotations", GATED_AT)
        ops.append({"op": "add", "path": path, "value": stamp})
    return ops


def ungated_cause(pod: Mapping[str, Any]) -> str:
    """Why a member of a gang not released yet carries no gate, as far as the pod tells: the
    webhook's ``GATED_AT`` stamp says it was gated at creation and the gate went since (a
    person, another controller); without it, it was created without the gate (the webhook
    down or not asked), and one bound already runs. Only a gang's release lifts the gate as
    designed."""
    at = gated_at(pod)
    node = (_mapping(pod.get("spec")) or {}).get("nodeName")
    if at is None and isinstance(node, str) and node:
        return (
            f"bound to node {node} without ever having the {GATE} scheduling gate (created "
            "bound, or while the webhook was down, or before the namespace was opted in)"
        )
    if at is not None:
        return (
            f"gated by the webhook at {format_time(at)}, its {GATE} scheduling gate since "
            "removed while its gang is not released"
        )
    return (
        f"created without the {GATE} scheduling gate (was the webhook down, or the namespace "
        "not opted in?)"
    )


def admission_warnings(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """What the webhook warns of in its answer for a pod being created (kube-apiserver hands
    the warnings to the client that made the pod; kubectl prints them), for pods gangcheck
    cannot hold as they ask:

    * gangcheck's gate on a pod that names no PodGroup: nothing ever lifts it;
    * a member bound at creation (``spec.nodeName``): never gated, and a kubelet runs a pod
      named to it whatever the node's taints, gangcheck's holds included;
    * a toleration of gangcheck's hold (or arriving) taint with ``operator: Exists``: the pod
      may take nodes held for any gang. One request's hold tolerated (``Equal``, its value)
      is what gangcheck or Kueue's podSetUpdates give a gang's own pods, and a DaemonSet's
      pods run on every node by design: neither is warned of.
    """
    spec = _mapping(pod.get("spec")) or {}
    group = group_of(pod)
    warnings: list[str] = []
    if group is None and is_gated(pod):
        warnings.append(
            f"gangcheck: the pod carries the {GATE} scheduling gate but names no PodGroup: "
            "gangcheck never lifts it, the pod waits until it is removed"
        )
    node = spec.get("nodeName")
    if group is not None and isinstance(node, str) and node:
        warnings.append(
            f"gangcheck: the pod names PodGroup {group.name} but is bound to node {node} at "
            "creation: it is not gated, starts before its gang's capacity exists, and ignores "
            "gangcheck's holds"
        )
    tolerations = spec.get("tolerations")
    metadata = _mapping(pod.get("metadata")) or {}
    if controlled_by_daemonset(metadata.get("ownerReferences")):  # on every node by design
        tolerations = None
    for toleration in tolerations if isinstance(tolerations, list) else ():
        t = _mapping(toleration) or {}
        key = t.get("key")
        if key in (HOLD_TAINT, ARRIVING_TAINT) and t.get("operator") == "Exists":
            warnings.append(
                f"gangcheck: the pod tolerates {key} with operator Exists: it may be scheduled "
                "onto nodes gangcheck keeps for gangs, taking a gang's capacity"
            )
    return tuple(w[:256] for w in warnings)
