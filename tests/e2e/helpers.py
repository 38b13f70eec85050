"""Small helpers of the end-to-end suite: resources, waiting, conditions, object builders.

Everything here talks to the cluster through a kubeconfig only, so the suite runs unchanged
against the local stack or any other cluster (kind ...).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from gangcheck_dev.testbed import nodes

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import EVENT, NAMESPACE, Resource
from tests import waiting

Obj = dict[str, Any]
T = TypeVar("T")

CONFIG_MAP = Resource("", "v1", "configmaps", "ConfigMap")
SERVICE_ACCOUNT = Resource("", "v1", "serviceaccounts", "ServiceAccount")
JOB = Resource("batch", "v1", "jobs", "Job")
CLUSTER_QUEUE = Resource("kueue.x-k8s.io", "v1beta2", "clusterqueues", "ClusterQueue", False)
LOCAL_QUEUE = Resource("kueue.x-k8s.io", "v1beta2", "localqueues", "LocalQueue")

#: kwok's own advice: taint fake nodes so only pods that mean to run there do.
KWOK_TAINT = nodes.Taint("kwok.x-k8s.io/node", "fake", "NoSchedule")
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
POOL_LABEL = "gangcheck.io/e2e-pool"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    *,
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = 0.25,
) -> T:
    """Polls ``probe`` until it returns something truthy; fails naming what did not happen
    (tests/waiting.eventually, with the end-to-end suite's defaults)."""
    return await waiting.eventually(probe, timeout=timeout, what=what, interval=interval)


async def events_of(kube: Kube, obj: Obj) -> list[Obj]:
    """The Events recorded on ``obj`` (by uid): durable records of what happened to it, where
    polling the object itself could miss a state that lasted less than the poll interval."""
    meta = obj["metadata"]
    listing = await kube.list_objects(
        EVENT, meta.get("namespace"), field_selector=f"involvedObject.uid={meta['uid']}"
    )
    return list(listing.get("items") or [])


async def events_with(kube: Kube, obj: Obj, *reasons: str, timeout: float = 30.0) -> list[Obj]:
    """The Events recorded on ``obj`` once one of each of ``reasons`` is among them: gangcheck
    sends its Events in the background, after the writes the decision made, so what a test
    sees of those writes (a request deleted, a Job running) may come before them."""

    async def probe() -> list[Obj] | None:
        events = await events_of(kube, obj)
        return events if all(messages(events, r) for r in reasons) else None

    return await eventually(probe, timeout=timeout, what=f"Events {', '.join(reasons)}")


def messages(events: list[Obj], reason: str) -> list[str]:
    """The messages of the Events with ``reason``."""
    return [str(e.get("message") or "") for e in events if e.get("reason") == reason]


def condition(obj: Obj, kind: str) -> Obj | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def is_true(obj: Obj, kind: str) -> bool:
    cond = condition(obj, kind)
    return cond is not None and cond.get("status") == "True"


async def get_or_none(kube: Kube, res: Resource, name: str, namespace: str | None = None) -> Any:
    try:
        return await kube.get(res, name, namespace)
    except NotFoundError:
        return None


async def delete_quietly(
    kube: Kube, res: Resource, name: str, namespace: str | None = None
) -> None:
    with contextlib.suppress(NotFoundError):
        await kube.delete(res, name, namespace)


def kwok_node(name: str, pool: str, *, cpu: str = "8", memory: str = "32Gi") -> Obj:
    """A fake node kwok manages (annotation ``kwok.x-k8s.io/node: fake``), tainted, in ``pool``
    (the builder is a plain function: nothing of the launcher runs)."""
    return nodes.kwok_node(
        name, cpu=cpu, memory=memory, labels={POOL_LABEL: pool}, taints=[KWOK_TAINT]
    )


def node_ready(node: Obj) -> bool:
    return is_true(node, "Ready")


def container(requests: dict[str, str], limits: dict[str, str] | None = None) -> Obj:
    resources: Obj = {"requests": requests}
    if limits:
        resources["limits"] = limits
    return {"name": "main", "image": "e2e-placeholder:1", "resources": resources}


@contextlib.asynccontextmanager
async def fresh_namespace(kube: Kube) -> AsyncIterator[str]:
    """A new namespace with its default ServiceAccount; deleted (not awaited) afterwards."""
    name = unique("e2e")
    await kube.create(NAMESPACE, {"metadata": {"name": name}})

    async def account() -> object:
        return await get_or_none(kube, SERVICE_ACCOUNT, "default", name)

    # kube-controller-manager creates it; the ServiceAccount admission plugin refuses pods
    # until it exists.
    await eventually(account, timeout=30, what=f"ServiceAccount {name}/default")
    try:
        yield name
    finally:
        await delete_quietly(kube, NAMESPACE, name)
