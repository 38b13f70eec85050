"""The simulated cloud's engine: watches requests and its ConfigMap, writes conditions and Nodes.

One driver task per request (keyed by uid) decides once, records the plan on the request,
then sleeps until each step of the plan is due and applies it. Decisions are serialized so
that two requests never count the same free room of a node group. Everything the engine
needs to resume lives on API objects: the plan and the delivered nodes on the request, the
``times`` counters on the ConfigMap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import AlreadyExistsError, ApiError, ConflictError, NotFoundError
from gangcheck.kube.informer import Informer
from gangcheck.kube.resources import (
    CONFIG_MAP,
    EVENT,
    NODE,
    POD_TEMPLATE,
    PROVISIONING_REQUEST,
)
from gangcheck.logic.timefmt import format_time
from gangcheck.model.objects import Obj
from gangcheck_dev.simcloud import model
from gangcheck_dev.simcloud.model import Condition, Plan, PlannedNode, SimConfig, Step

log = logging.getLogger(__name__)

CONFIG_KEY = "config"
#: The reason of the Event recorded on a request for each node delivered for it.
DELIVERED_REASON = "NodeDelivered"
_RETRY_DELAY = 1.0
_WRITE_ATTEMPTS = 10
T = TypeVar("T")


class SimCloud:
    """Plays cluster-autoscaler plus a cloud for ProvisioningRequests, with real Nodes."""

    def __init__(
        self,
        kube: Kube,
        config_map: str,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
        watch_timeout: int = 300,
    ) -> None:
        self.kube = kube
        self.namespace, _, self.config_map = config_map.rpartition("/")
        self.namespace = self.namespace or "default"
        self.config = SimConfig()
        #: resourceVersion of the ConfigMap last read ("" while it does not exist).
        self.config_resource_version: str | None = None
        self.config_error: str | None = None
        self.ready = asyncio.Event()
        self._requests = Informer(kube, PROVISIONING_REQUEST, watch_timeout=watch_timeout)
        self._watch_timeout = watch_timeout
        self._rng = rng or random.Random()
        self._clock = clock
        self._plans: dict[str, Plan] = {}
        self._drivers: dict[str, asyncio.Task[None]] = {}
        self._finished: set[str] = set()
        self._uses: Counter[str] = Counter()
        self._decide_lock = asyncio.Lock()
        self._critical: set[asyncio.Task[Any]] = set()
        self._config_loaded = asyncio.Event()

    # ---- the task tree ------------------------------------------------------------------

    async def run(self) -> None:
        """Run until cancelled; pending deliveries resume when a new sim starts."""
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._watch_config())
                group.create_task(self._requests.run())
                await self._config_loaded.wait()
                await self._requests.synced.wait()
                self._requests.add_handler(self._on_request)
                self._rescan()
                self.ready.set()
        finally:
            await self._stop_drivers()

    async def _stop_drivers(self) -> None:
        """Cancel the drivers, but let writes in flight finish: a node created is recorded."""
        drivers = list(self._drivers.values())
        for task in drivers:
            task.cancel()
        await asyncio.gather(*drivers, return_exceptions=True)
        await asyncio.gather(*self._critical, return_exceptions=True)
        self._drivers.clear()

    async def _to_completion(self, work: Coroutine[Any, Any, T]) -> T:
        """Run work to its end even if the caller is cancelled (a graceful stop waits for it)."""
        task = asyncio.create_task(work)
        self._critical.add(task)
        task.add_done_callback(self._critical.discard)
        return await asyncio.shield(task)

    def _rescan(self) -> None:
        for obj in self._requests.store:
            self._on_request(None, obj)

    def _on_request(self, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            self._forget(str((old or {}).get("metadata", {}).get("uid", "")))
            return
        meta = new["metadata"]
        uid = str(meta["uid"])
        running = uid in self._drivers and not self._drivers[uid].done()
        if running or uid in self._finished or not self.config.watches(meta["namespace"]):
            return
        plan = model.plan_from_annotations(new)
        if plan is None and not self.config.answers(new):
            return
        if plan is not None:  # counted at once: nodes on their way take room from new requests
            self._plans.setdefault(uid, plan)
        task = asyncio.create_task(self._drive(uid, meta["namespace"], meta["name"]))
        self._drivers[uid] = task

    def _forget(self, uid: str) -> None:
        task = self._drivers.pop(uid, None)
        if task is not None:
            task.cancel()
        self._plans.pop(uid, None)
        self._finished.discard(uid)

    # ---- one request --------------------------------------------------------------------

    async def _drive(self, uid: str, namespace: str, name: str) -> None:
        while True:
            try:
                await self._drive_once(uid, namespace, name)
                return
            except asyncio.CancelledError:
                raise
            except NotFoundError:
                return
            except Exception:
                log.exception("sim-cloud driver failed; retrying", extra={"request": name})
                await asyncio.sleep(_RETRY_DELAY)

    async def _drive_once(self, uid: str, namespace: str, name: str) -> None:
        plan = await self._plan_for(uid, namespace, name)
        while plan is not None:
            request = await self.kube.get(PROVISIONING_REQUEST, name, namespace)
            if request["metadata"]["uid"] != uid:
                return
            plan = model.plan_from_annotations(request) or plan
            conditions = (request.get("status") or {}).get("conditions") or []
            due, next_at = model.due_steps(plan, conditions, self._clock())
            for step in due:
                plan = await self._to_completion(self._apply(step, plan, request))
            self._plans[uid] = plan
            if next_at is None:
                self._finished.add(uid)
                return
            await asyncio.sleep(max(0.0, next_at - self._clock()))

    async def _plan_for(self, uid: str, namespace: str, name: str) -> Plan | None:
        request = await self.kube.get(PROVISIONING_REQUEST, name, namespace)
        if request["metadata"]["uid"] != uid:
            return None  # recreated under the same name: the new one has its own driver
        plan = model.plan_from_annotations(request)
        if plan is None:
            async with self._decide_lock:
                plan = await self._to_completion(self._decide(request))
        if plan is not None:
            self._plans[uid] = plan
        else:
            self._finished.add(uid)
        return plan

    async def _decide(self, request: Obj) -> Plan | None:
        """Choose the rule, size the request and record the plan on it; None when not ours."""
        meta, spec = request["metadata"], request.get("spec") or {}
        if not self.config.answers(request):
            return None
        if (request.get("status") or {}).get("conditions"):
            return None  # someone else answers this request
        namespace, name = meta["namespace"], meta["name"]
        key, scenario = model.choose_scenario(
            self.config, namespace=namespace, name=name, uses=self._uses
        )
        demands = await self._demands(namespace, spec.get("podSets") or [])
        used = await self._used_nodes(exclude=str(meta["uid"]))
        sizing = model.size_request(demands, self.config.node_groups, used)
        plan = model.build_plan(
            scenario,
            sizing,
            groups=self.config.node_groups,
            started_at=self._clock(),
            no_retry=(spec.get("parameters") or {}).get(model.NO_RETRY) == "true",
            rng=self._rng,
            rule_key=key,
        )
        await self._save_plan(namespace, name, plan)
        log.info("sim-cloud planned %s/%s: %s", namespace, name, plan.message or plan.outcome)
        if scenario.times is not None and key is not None:
            await self._count_use(key)
        return plan

    async def _demands(self, namespace: str, pod_sets: list[Obj]) -> list[model.PodSetDemand]:
        demands = []
        for pod_set in pod_sets:
            template = str((pod_set.get("podTemplateRef") or {}).get("name", ""))
            member: model.Member | None
            try:
                member = model.member_of(await self.kube.get(POD_TEMPLATE, template, namespace))
            except NotFoundError:
                member = None
            demands.append(model.PodSetDemand(template, int(pod_set.get("count", 1)), member))
        return demands

    async def _used_nodes(self, *, exclude: str) -> Counter[str]:
        """Per group: nodes that exist, plus nodes other plans still have on their way."""
        listing = await self.kube.list_objects(NODE, label_selector=model.NODEGROUP_LABEL)
        used = Counter[str](
            node["metadata"]["labels"][model.NODEGROUP_LABEL] for node in listing.get("items") or []
        )
        for uid, plan in self._plans.items():
            if uid != exclude:
                used.update(plan.undelivered())
        return used

    # ---- applying a step ----------------------------------------------------------------

    async def _apply(self, step: Step, plan: Plan, request: Obj) -> Plan:
        meta = request["metadata"]
        if step.node is not None:
            if await self._deliver(step.node, plan, f"{meta['namespace']}/{meta['name']}"):
                await self._record_delivery(request, step.node.name)
            plan = plan.with_delivered(step.node.name)
        elif step.revoke:
            await self._delete_nodes(plan.delivered)
            revoked = model.revoked_condition(len(plan.delivered))
            await self._set_condition(meta["namespace"], meta["name"], revoked)
            plan = plan.model_copy(update={"revoked": True})
        elif step.condition is not None:
            await self._set_condition(meta["namespace"], meta["name"], step.condition)
            return plan
        await self._save_plan(meta["namespace"], meta["name"], plan)
        return plan

    async def _set_condition(self, namespace: str, name: str, condition: Condition) -> None:
        for _ in range(_WRITE_ATTEMPTS):
            request = await self.kube.get(PROVISIONING_REQUEST, name, namespace)
            status = request.setdefault("status", {})
            status["conditions"] = model.set_condition(
                status.get("conditions") or [],
                condition,
                now=format_time(datetime.now(UTC)),
                generation=int(request["metadata"].get("generation", 1)),
            )
            with contextlib.suppress(ConflictError):
                await self.kube.replace(PROVISIONING_REQUEST, request, subresource="status")
                log.info(
                    "sim-cloud %s/%s: %s=%s", namespace, name, condition.type, condition.status
                )
                return
        raise ConflictError(409, "Conflict", "request status kept changing", target=name)

    async def _deliver(self, node: PlannedNode, plan: Plan, request: str) -> bool:
        """Creates the node and makes it Ready; False if it existed already."""
        group = plan.groups[node.group]
        # A real node comes up seconds after the request: never stamp one in the second the
        # request was seen (creationTimestamp has 1 s resolution; gangcheck counts a node as
        # arrived for a request only when it is stamped in a later second).
        wait = math.floor(plan.started_at) + 1.001 - self._clock()
        await asyncio.sleep(min(max(0.0, wait), 1.001))
        now = datetime.now(UTC)
        body = model.node_object(
            node.name,
            group,
            request=request,
            created_at=now.isoformat(timespec="microseconds").replace("+00:00", "Z"),
            now=format_time(now),
        )
        try:
            created = await self.kube.create(NODE, body)
        except AlreadyExistsError:
            log.warning("sim-cloud node %s already exists; counted as delivered", node.name)
            return False
        await self._mark_ready(created, group)
        log.info("sim-cloud delivered node %s for %s", node.name, request)
        return True

    async def _record_delivery(self, request: Obj, node: str) -> None:
        """An Event on the request naming the node delivered for it (reason
        ``NodeDelivered``): the record of a scale-up that outlives the node and the request,
        as a cloud's own log would."""
        meta = request["metadata"]
        now = format_time(datetime.now(UTC))
        event = {
            "metadata": {"generateName": f"{meta['name'][:200]}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": PROVISIONING_REQUEST.api_version,
                "kind": PROVISIONING_REQUEST.kind,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": DELIVERED_REASON,
            "message": f"node {node} delivered",
            "type": "Normal",
            "source": {"component": "sim-cloud"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.kube.create(EVENT, event)
        except ApiError as exc:
            log.warning("sim-cloud could not record the delivery of %s: %s", node, exc)

    async def _mark_ready(self, node: Obj, group: model.NodeGroup) -> None:
        """Ready=True through the status subresource, then lift the not-ready taint the API
        server put on at creation: what kubelet and the node lifecycle controller would do,
        so the nodes are usable without kwok or kube-controller-manager."""
        name = node["metadata"]["name"]
        for _ in range(_WRITE_ATTEMPTS):
            node["status"] = {
                **(node.get("status") or {}),
                **model.node_status(group, now=format_time(datetime.now(UTC))),
            }
            try:
                node = await self.kube.replace(NODE, node, subresource="status")
                break
            except ConflictError:
                node = await self.kube.get(NODE, name)
        for _ in range(_WRITE_ATTEMPTS):
            with contextlib.suppress(ConflictError):
                await self._untaint(node)
                return
            node = await self.kube.get(NODE, name)

    async def _untaint(self, node: Obj) -> None:
        taints = (node.get("spec") or {}).get("taints") or []
        kept = [t for t in taints if t.get("key") != model.NOT_READY_TAINT]
        if kept == taints:
            return
        meta = node["metadata"]
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "spec": {"taints": kept}}
        await self.kube.merge_patch(NODE, meta["name"], patch)

    async def _delete_nodes(self, names: tuple[str, ...]) -> None:
        for name in names:
            with contextlib.suppress(NotFoundError):
                await self.kube.delete(NODE, name)

    async def _save_plan(self, namespace: str, name: str, plan: Plan) -> None:
        patch = {"metadata": {"annotations": {model.PLAN_ANNOTATION: plan.to_json()}}}
        await self.kube.merge_patch(PROVISIONING_REQUEST, name, patch, namespace)

    # ---- the ConfigMap ------------------------------------------------------------------

    async def _count_use(self, key: str) -> None:
        self._uses[key] += 1
        raw = json.dumps(dict(self._uses), sort_keys=True)
        patch = {"metadata": {"annotations": {model.RULE_USES_ANNOTATION: raw}}}
        with contextlib.suppress(NotFoundError):
            await self.kube.merge_patch(CONFIG_MAP, self.config_map, patch, self.namespace)

    async def _watch_config(self) -> None:
        """List, then watch, the ConfigMap's namespace; re-read the config on every change."""
        while True:
            try:
                rv = await self._list_config()
                await self._follow_config(rv)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a broken watch: list again
                log.warning("sim-cloud config watch failed, relisting: %s", e)
                await asyncio.sleep(_RETRY_DELAY)

    async def _list_config(self) -> str:
        listing = await self.kube.list_objects(CONFIG_MAP, self.namespace)
        mine = [o for o in listing.get("items") or [] if o["metadata"]["name"] == self.config_map]
        self._load(mine[0] if mine else None)
        return str(listing["metadata"]["resourceVersion"])

    async def _follow_config(self, rv: str) -> None:
        events = self.kube.watch(
            CONFIG_MAP, self.namespace, resource_version=rv, timeout_seconds=self._watch_timeout
        )
        async with contextlib.aclosing(events):
            async for event in events:
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise ApiError(int(obj.get("code", 0)), "WatchError", str(obj))
                if obj.get("metadata", {}).get("name") != self.config_map:
                    continue
                self._load(None if event.get("type") == "DELETED" else obj)

    def _load(self, config_map: Obj | None) -> None:
        """Take the ConfigMap's config (defaults when it is missing; keep the last good one
        when it is invalid), then look again at requests not yet answered."""
        if config_map is None:
            self.config, self.config_error, self.config_resource_version = SimConfig(), None, ""
        else:
            self._take(config_map)
        self._config_loaded.set()
        if self.ready.is_set():
            self._rescan()

    def _take(self, config_map: Obj) -> None:
        meta = config_map["metadata"]
        self.config_resource_version = str(meta.get("resourceVersion", ""))
        uses = model.rule_uses((meta.get("annotations") or {}).get(model.RULE_USES_ANNOTATION))
        for key, count in uses.items():  # never below what this process counted itself
            self._uses[key] = max(self._uses[key], count)
        text = str((config_map.get("data") or {}).get(CONFIG_KEY, ""))
        try:
            config = model.parse_config(text)
        except ValueError as e:
            self.config_error = str(e)
            log.error(
                "sim-cloud config %s is invalid, keeping the last one: %s", self.config_map, e
            )
            return
        if config != self.config:
            log.info("sim-cloud config loaded from %s/%s", self.namespace, self.config_map)
        self.config, self.config_error = config, None
