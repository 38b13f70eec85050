"""Builders for the API objects tests create or decide on, as raw dicts (like Kueue's wrappers)."""

from __future__ import annotations

import copy

from gangcheck.kube.resources import NODE_POOL
from gangcheck.model.objects import Obj

T0 = "2026-11-30T10:00:00Z"
CHECK = "atomic"
CONTROLLER = "gangcheck.io/atomic-provisioning"


def admission_check(
    *, config: str = "cfg", active: bool = True, message: str = "", name: str = CHECK
) -> Obj:
    """gangcheck's AdmissionCheck naming the AtomicProvisioningConfig `config`, its Active
    condition `active` (with `message`, when given)."""
    condition: Obj = {"type": "Active", "status": str(active)}
    if message:
        condition["message"] = message
    return {
        "metadata": {"name": name},
        "spec": {
            "controllerName": CONTROLLER,
            "parameters": {
                "apiGroup": "gangcheck.io",
                "kind": "AtomicProvisioningConfig",
                "name": config,
            },
        },
        "status": {"conditions": [condition]},
    }


def container(cpu: str = "1", gpu: int = 0, memory: str = "1Gi", limits_only: bool = False) -> Obj:
    res: dict[str, str] = {"cpu": cpu, "memory": memory}
    gpus = {"nvidia.com/gpu": str(gpu)} if gpu else {}
    if limits_only:
        return {"name": "main", "image": "trainer:1", "resources": {"limits": {**res, **gpus}}}
    resources = {"requests": {**res, **gpus}, "limits": dict(gpus)} if gpu else {"requests": res}
    return {"name": "main", "image": "trainer:1", "resources": resources}


def pod_template(
    *,
    cpu: str = "1",
    gpu: int = 0,
    tolerations: list[Obj] | None = None,
    node_selector: dict[str, str] | None = None,
    limits_only: bool = False,
) -> Obj:
    spec: Obj = {
        "containers": [container(cpu, gpu, limits_only=limits_only)],
        "restartPolicy": "Never",
    }
    if tolerations:
        spec["tolerations"] = tolerations
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"spec": spec}


class WorkloadBuilder:
    def __init__(self, name: str = "wl", namespace: str = "default") -> None:
        self.obj: Obj = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{name}",
                "resourceVersion": "1",
                "annotations": {},
            },
            "spec": {"podSets": [], "queueName": "lq"},
            "status": {},
        }

    def pod_set(self, name: str, count: int, template: Obj | None = None) -> WorkloadBuilder:
        self.obj["spec"]["podSets"].append(
            {"name": name, "count": count, "template": template or pod_template(gpu=1)}
        )
        return self

    def annotation(self, key: str, value: str) -> WorkloadBuilder:
        self.obj["metadata"]["annotations"][key] = value
        return self

    def condition(self, kind: str, status: str = "True", reason: str = "Test") -> WorkloadBuilder:
        conds = self.obj["status"].setdefault("conditions", [])
        conds[:] = [c for c in conds if c["type"] != kind]
        conds.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": "",
                "lastTransitionTime": T0,
            }
        )
        return self

    def reserve_quota(
        self, flavor: str = "gpu", counts: dict[str, int] | None = None
    ) -> WorkloadBuilder:
        self.obj["status"]["admission"] = {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {
                    "name": ps["name"],
                    "flavors": {"nvidia.com/gpu": flavor, "cpu": flavor},
                    "count": (counts or {}).get(ps["name"], ps["count"]),
                }
                for ps in self.obj["spec"]["podSets"]
            ],
        }
        return self.condition("QuotaReserved")

    def check(
        self,
        name: str = CHECK,
        state: str = "Pending",
        *,
        retry_count: int = 0,
        message: str = "",
        pod_set_updates: list[Obj] | None = None,
    ) -> WorkloadBuilder:
        entry: Obj = {"name": name, "state": state, "message": message, "lastTransitionTime": T0}
        if retry_count:
            entry["retryCount"] = retry_count
        if pod_set_updates:
            entry["podSetUpdates"] = pod_set_updates
        checks = self.obj["status"].setdefault("admissionChecks", [])
        checks[:] = [c for c in checks if c["name"] != name]
        checks.append(entry)
        return self

    def build(self) -> Obj:
        return copy.deepcopy(self.obj)


def provisioning_request(
    name: str,
    *,
    namespace: str = "default",
    owner_uid: str = "uid-wl",
    class_name: str = "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
    templates: list[tuple[str, int]] | None = None,
    conditions: dict[str, str] | None = None,
    parameters: dict[str, str] | None = None,
    created: str = T0,
    annotations: dict[str, str] | None = None,
) -> Obj:
    return {
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "resourceVersion": "5",
            "creationTimestamp": created,
            "annotations": {
                "gangcheck.io/workload": "wl",
                "gangcheck.io/check": CHECK,
                "gangcheck.io/workload-uid": owner_uid,
                **(annotations or {}),
            },
        },
        "spec": {
            "provisioningClassName": class_name,
            "parameters": parameters or {},
            "podSets": [{"podTemplateRef": {"name": t}, "count": c} for t, c in (templates or [])],
        },
        "status": {
            "conditions": [
                {"type": k, "status": "True", "reason": k, "message": v, "lastTransitionTime": T0}
                for k, v in (conditions or {}).items()
            ]
        },
    }


def capacity_not_found(request: Obj) -> Obj:
    """`request` (changed in place, and returned) as cluster-autoscaler leaves one when no
    node group can host its pods: Accepted, and Provisioned=False for CapacityIsNotFound (it
    tries again later)."""
    request["status"]["conditions"] = [
        {"type": "Accepted", "status": "True", "reason": "Accepted", "message": ""},
        {
            "type": "Provisioned",
            "status": "False",
            "reason": "CapacityIsNotFound",
            "message": "Capacity is not found, CA will try to find it later.",
        },
    ]
    return request


def node(
    name: str,
    *,
    gpu: int = 8,
    cpu: str = "64",
    created: str = T0,
    labels: dict[str, str] | None = None,
    taints: list[Obj] | None = None,
    ready: bool = True,
    annotations: dict[str, str] | None = None,
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "creationTimestamp": created,
            "resourceVersion": "7",
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": {"taints": taints or []},
        "status": {
            "allocatable": {
                "cpu": cpu,
                "memory": "512Gi",
                "pods": "110",
                "nvidia.com/gpu": str(gpu),
            },
            "capacity": {"cpu": cpu, "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpu)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def node_pool(
    name: str,
    *,
    uid: str | None = None,
    requirements: list[Obj] | None = None,
    labels: dict[str, str] | None = None,
    taints: list[Obj] | None = None,
    expire_after: str | None = None,
    limits: dict[str, str] | None = None,
    used: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    typed: bool = False,
) -> Obj:
    """A Karpenter NodePool of the kwok provider (its nodes of KWOKNodeClass ``default``) with
    only what gangcheck reads of one: its name (and `uid`, when given) and its node template's
    class and `requirements` (none by default); each of the rest only when given: the
    template's node `labels`, `taints` and ``expireAfter``, the pool's `limits`, the resources
    its nodes `used` (its status), its `annotations` (Karpenter's template hash). `typed`: with
    apiVersion and kind, as a list's item or a fake API server's stored object carries them."""
    metadata: Obj = {"name": name}
    if uid is not None:
        metadata["uid"] = uid
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    template: Obj = {
        "spec": {
            "nodeClassRef": {
                "group": "karpenter.kwok.sh",
                "kind": "KWOKNodeClass",
                "name": "default",
            },
            "requirements": copy.deepcopy(requirements or []),
        }
    }
    if labels is not None:
        template["metadata"] = {"labels": dict(labels)}
    if taints is not None:
        template["spec"]["taints"] = copy.deepcopy(taints)
    if expire_after is not None:
        template["spec"]["expireAfter"] = expire_after
    pool: Obj = {"metadata": metadata, "spec": {"template": template}}
    if limits is not None:
        pool["spec"]["limits"] = dict(limits)
    if used is not None:
        pool["status"] = {"resources": dict(used)}
    if typed:
        pool = {"apiVersion": NODE_POOL.api_version, "kind": NODE_POOL.kind} | pool
    return pool
