"""What the caches keep of a Pod or a Node: the fields the controller reads, nothing else.

A Pod as the API server sends it is tens of KiB (managedFields, images, env, volumes,
container statuses); a cluster's worth of them is most of the controller's memory. What is
read of a cached Pod, by whom:

- metadata: name, namespace, uid, labels (group membership), annotations (the request it
  consumes, when it was gated), ownerReferences, resourceVersion, creationTimestamp,
  deletionTimestamp;
- spec: what a fit counts (containers' and init containers' resources and restartPolicy,
  `resources`, `overhead`, `nodeName`) and what it matches (nodeSelector, affinity,
  tolerations, resourceClaims, schedulingGates, schedulingGroup); a PodGroup member keeps its
  whole spec, for the PodTemplate its gang asks capacity with is made of it;
- status: phase, conditions, nominatedNodeName.

Of a Node: the same metadata, the whole spec (taints, unschedulable, providerID), and of its
status allocatable, capacity and conditions (not images, which can be larger than the rest).
The webhook and the reclaimers read live objects where they need more.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gangcheck.logic.podgroups.gating import group_of
from gangcheck.model.objects import Obj

METADATA = (
    "name",
    "namespace",
    "uid",
    "labels",
    "annotations",
    "ownerReferences",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
)
POD_SPEC = (
    "nodeName",
    "nodeSelector",
    "affinity",
    "tolerations",
    "resourceClaims",
    "schedulingGates",
    "schedulingGroup",
    "resources",
    "overhead",
)
CONTAINER = ("name", "resources", "restartPolicy")
POD_STATUS = ("phase", "conditions", "nominatedNodeName")
NODE_STATUS = ("allocatable", "capacity", "conditions")


def trim_pod(pod: Obj) -> Obj:
    """The Pod with only what the controller reads (see the module doc)."""
    spec = _mapping(pod.get("spec"))
    if group_of(pod) is None:
        kept = _only(spec, POD_SPEC)
        for key in ("containers", "initContainers"):
            if isinstance(spec.get(key), list):
                kept[key] = [_only(_mapping(c), CONTAINER) for c in spec[key]]
        spec = kept
    return _object(pod, spec, _only(_mapping(pod.get("status")), POD_STATUS))


def trim_node(node: Obj) -> Obj:
    """The Node with only what the controller reads (see the module doc)."""
    status = _only(_mapping(node.get("status")), NODE_STATUS)
    return _object(node, _mapping(node.get("spec")), status)


def _object(obj: Obj, spec: Mapping[str, Any], status: Obj) -> Obj:
    out: Obj = {k: obj[k] for k in ("apiVersion", "kind") if k in obj}
    out["metadata"] = _only(_mapping(obj.get("metadata")), METADATA)
    if "spec" in obj:
        out["spec"] = spec
    if "status" in obj:
        out["status"] = status
    return out


def _only(obj: Mapping[str, Any], keys: Iterable[str]) -> Obj:
    return {k: obj[k] for k in keys if k in obj}


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
