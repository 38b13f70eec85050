"""Typed, frozen views over the API objects gangcheck decides on.

Parsing is lenient about absent fields (the API server already validated the objects) and
keeps the raw dict where a decision needs to pass it through (pod templates).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gangcheck.model.names import (
    CONSUME_ANNOTATION,
    FLAVORS_ANNOTATION,
    GATE,
    WORKLOAD_UID_ANNOTATION,
)

Obj = dict[str, Any]
"""An API object (or any JSON object) as the API server sends it: a plain, mutable dict."""
ReadOnlyObj = Mapping[str, Any]
"""An API object only read, never changed: what code that only reads it accepts, so that a
frozen mapping or a typed dict may be passed as well."""


def json_pointer(*tokens: str) -> str:
    """The JSON Pointer (RFC 6901) of a path in an object, its reference tokens escaped:
    ``json_pointer("metadata", "annotations", "a/b")`` is ``/metadata/annotations/a~1b``."""
    return "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in tokens)


def tested_removal(field: str, key: str, value: str) -> list[Obj]:
    """JSON patch ops (RFC 6902) removing ``metadata.<field>.<key>`` only while it still has
    `value`: a value changed meanwhile fails the whole patch, never gets dropped."""
    path = json_pointer("metadata", field, key)
    return [{"op": "test", "path": path, "value": value}, {"op": "remove", "path": path}]


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""

    @property
    def is_true(self) -> bool:
        return self.status == "True"


FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
"""Pod phases after which a pod holds no resources and never runs again."""


def labels_of(obj: ReadOnlyObj) -> dict[str, str]:
    """An object's labels (none when it has none or they are not a map)."""
    labels = (obj.get("metadata") or {}).get("labels")
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}


def is_finished(pod: ReadOnlyObj) -> bool:
    """The pod ran to its end (Succeeded or Failed)."""
    return (pod.get("status") or {}).get("phase") in FINISHED_PHASES


def scheduling_gates(pod: ReadOnlyObj) -> tuple[str, ...]:
    """The names of the pod's scheduling gates (`spec.schedulingGates`), in order."""
    spec = pod.get("spec")
    gates = spec.get("schedulingGates") if isinstance(spec, Mapping) else None
    if not isinstance(gates, list):
        return ()
    return tuple(str(g.get("name") or "") for g in gates if isinstance(g, Mapping))


def conditions_of(obj: Obj) -> dict[str, Condition]:
    """The object's status.conditions by type."""
    return {
        c["type"]: Condition(
            type=c["type"],
            status=c.get("status", "Unknown"),
            reason=c.get("reason", ""),
            message=c.get("message", ""),
            last_transition_time=c.get("lastTransitionTime", ""),
        )
        for c in (obj.get("status") or {}).get("conditions") or []
    }


def is_true(conditions: dict[str, Condition], kind: str) -> bool:
    c = conditions.get(kind)
    return c is not None and c.is_true


@dataclass(frozen=True)
class ObjectRef:
    """Namespace, name and uid of an object: what logs, events and owners need."""

    kind: str
    namespace: str
    name: str
    uid: str = ""
    api_version: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    def __str__(self) -> str:
        return f"{self.kind}/{self.key}"


def ref_of(obj: ReadOnlyObj, kind: str = "", api_version: str = "") -> ObjectRef:
    """The object's reference; `kind` and `api_version` where the object does not say (a
    cached or listed object may not)."""
    meta = obj.get("metadata") or {}
    return ObjectRef(
        kind=str(obj.get("kind") or kind),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        api_version=str(obj.get("apiVersion") or api_version),
    )


@dataclass(frozen=True)
class Pod:
    """What the logic reads of a Pod, parsed once at the edge: who it is, where it runs or is
    nominated to, whether it still counts, what holds it back and which request it consumes.
    `raw` is the object itself, for what a decision passes through (the template a member
    stands for, the group it names, patches)."""

    ref: ObjectRef
    raw: ReadOnlyObj = field(repr=False, compare=False)
    resource_version: str = ""
    created: str = ""
    node_name: str = ""
    nominated_node_name: str = ""
    phase: str = ""
    deleting: bool = False
    gates: tuple[str, ...] = ()
    consumes: str = ""
    """The ProvisioningRequest it consumes (the autoscaler's annotation), by name."""
    daemonset: bool = False
    """Controlled by a DaemonSet."""

    @property
    def name(self) -> str:
        return self.ref.name

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES

    @property
    def live(self) -> bool:
        """Neither finished nor being deleted: it still counts."""
        return not self.deleting and not self.finished

    @property
    def gated(self) -> bool:
        """Still held back by gangcheck's scheduling gate."""
        return GATE in self.gates


def controlled_by_daemonset(owners: object) -> bool:
    """Whether ownerReferences (as read from a pod, malformed or not) name a DaemonSet as the
    pod's controller."""
    return any(
        isinstance(o, Mapping) and o.get("kind") == "DaemonSet" and o.get("controller")
        for o in (owners if isinstance(owners, list) else ())
    )


def pod_of(obj: ReadOnlyObj) -> Pod:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    owners = meta.get("ownerReferences") or []
    return Pod(
        ref=ref_of(obj, "Pod", "v1"),
        raw=obj,
        resource_version=str(meta.get("resourceVersion") or ""),
        created=str(meta.get("creationTimestamp") or ""),
        node_name=str(spec.get("nodeName") or ""),
        nominated_node_name=str(status.get("nominatedNodeName") or ""),
        phase=str(status.get("phase") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        gates=scheduling_gates(obj),
        consumes=str((meta.get("annotations") or {}).get(CONSUME_ANNOTATION) or ""),
        daemonset=controlled_by_daemonset(owners),
    )


@dataclass(frozen=True)
class PodSet:
    name: str
    count: int
    template: Obj


@dataclass(frozen=True)
class PodSetAssignment:
    name: str
    count: int | None
    flavors: dict[str, str]


@dataclass(frozen=True)
class CheckState:
    """One entry of Workload status.admissionChecks."""

    name: str
    state: str
    message: str = ""
    last_transition_time: str = ""
    retry_count: int = 0
    requeue_after_seconds: int | None = None
    pod_set_updates: tuple[Obj, ...] = ()

    def to_obj(self) -> Obj:
        out: Obj = {
            "name": self.name,
            "state": self.state,
            "message": self.message,
            "lastTransitionTime": self.last_transition_time,
        }
        if self.retry_count:
            out["retryCount"] = self.retry_count
        if self.requeue_after_seconds is not None:
            out["requeueAfterSeconds"] = self.requeue_after_seconds
        if self.pod_set_updates:
            out["podSetUpdates"] = list(self.pod_set_updates)
        return out


def check_state_of(entry: Obj) -> CheckState:
    return CheckState(
        name=entry["name"],
        state=entry.get("state", "Pending"),
        message=entry.get("message", ""),
        last_transition_time=entry.get("lastTransitionTime", ""),
        retry_count=int(entry.get("retryCount") or 0),
        requeue_after_seconds=entry.get("requeueAfterSeconds"),
        pod_set_updates=tuple(entry.get("podSetUpdates") or ()),
    )


@dataclass(frozen=True)
class Workload:
    ref: ObjectRef
    resource_version: str
    annotations: dict[str, str]
    pod_sets: tuple[PodSet, ...]
    assignments: tuple[PodSetAssignment, ...] | None
    conditions: dict[str, Condition]
    checks: dict[str, CheckState]
    active: bool = True
    deleting: bool = False

    @property
    def has_quota_reservation(self) -> bool:
        return is_true(self.conditions, "QuotaReserved")

    @property
    def is_admitted(self) -> bool:
        return is_true(self.conditions, "Admitted")

    @property
    def is_finished(self) -> bool:
        return is_true(self.conditions, "Finished")

    @property
    def is_evicted(self) -> bool:
        return is_true(self.conditions, "Evicted")

    def assignment(self, pod_set: str) -> PodSetAssignment | None:
        return next((a for a in self.assignments or () if a.name == pod_set), None)

    @property
    def flavors(self) -> tuple[str, ...]:
        """The resource flavors its quota reservation assigned, sorted, each once (what its
        sources' outcomes are published for)."""
        return tuple(sorted({f for a in self.assignments or () for f in a.flavors.values()}))


def workload_of(obj: Obj) -> Workload:
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    admission = status.get("admission")
    return Workload(
        ref=ref_of(obj, "Workload"),
        resource_version=meta.get("resourceVersion", ""),
        annotations=dict(meta.get("annotations") or {}),
        pod_sets=tuple(
            PodSet(p["name"], int(p.get("count", 1)), p.get("template") or {})
            for p in spec.get("podSets") or []
        ),
        assignments=None
        if admission is None
        else tuple(
            PodSetAssignment(a["name"], a.get("count"), dict(a.get("flavors") or {}))
            for a in admission.get("podSetAssignments") or []
        ),
        conditions=conditions_of(obj),
        checks={c["name"]: check_state_of(c) for c in status.get("admissionChecks") or []},
        active=spec.get("active", True) is not False,
        deleting=bool(meta.get("deletionTimestamp")),
    )


@dataclass(frozen=True)
class RequestPodSet:
    template_name: str
    count: int


@dataclass(frozen=True)
class ProvisioningRequest:
    ref: ObjectRef
    resource_version: str
    class_name: str
    parameters: dict[str, str]
    pod_sets: tuple[RequestPodSet, ...]
    conditions: dict[str, Condition]
    annotations: dict[str, str]
    owner_uids: tuple[str, ...]
    creation_timestamp: str = ""
    deleting: bool = False
    class_details: dict[str, str] = field(default_factory=dict)
    deletion_timestamp: str = ""
    """metadata.deletionTimestamp: since when it is being deleted ("" when it is not)."""
    finalizers: tuple[str, ...] = ()
    """metadata.finalizers: what its deletion waits on (another controller's to remove)."""

    @property
    def name(self) -> str:
        return self.ref.name

    @property
    def workload_uid(self) -> str:
        """The uid of the Workload the request is for (an annotation, not an owner)."""
        return self.annotations.get(WORKLOAD_UID_ANNOTATION) or next(iter(self.owner_uids), "")

    @property
    def flavors(self) -> tuple[str, ...]:
        """The resource flavors its Workload was assigned when it asked (FLAVORS_ANNOTATION;
        none on a request of a PodGroup, or made before gangcheck recorded them)."""
        recorded = self.annotations.get(FLAVORS_ANNOTATION, "")
        return tuple(f for f in recorded.split(",") if f)


def request_of(obj: Obj) -> ProvisioningRequest:
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    return ProvisioningRequest(
        ref=ref_of(obj, "ProvisioningRequest"),
        resource_version=meta.get("resourceVersion", ""),
        class_name=spec.get("provisioningClassName", ""),
        parameters={k: str(v) for k, v in (spec.get("parameters") or {}).items()},
        pod_sets=tuple(
            RequestPodSet(p["podTemplateRef"]["name"], int(p.get("count", 1)))
            for p in spec.get("podSets") or []
        ),
        conditions=conditions_of(obj),
        annotations=dict(meta.get("annotations") or {}),
        owner_uids=tuple(r.get("uid", "") for r in meta.get("ownerReferences") or []),
        creation_timestamp=meta.get("creationTimestamp", ""),
        deleting=bool(meta.get("deletionTimestamp")),
        deletion_timestamp=str(meta.get("deletionTimestamp") or ""),
        finalizers=tuple(str(f) for f in meta.get("finalizers") or ()),
        class_details={
            k: str(v) for k, v in (status.get("provisioningClassDetails") or {}).items()
        },
    )


@dataclass(frozen=True)
class Flavor:
    """What a ResourceFlavor adds to the pods placed on it."""

    name: str
    node_labels: dict[str, str]
    tolerations: tuple[Obj, ...]


def flavor_of(obj: Obj) -> Flavor:
    spec = obj.get("spec") or {}
    return Flavor(
        name=obj["metadata"]["name"],
        node_labels=dict(spec.get("nodeLabels") or {}),
        tolerations=tuple(spec.get("tolerations") or ()),
    )
