"""Serves the ProvisioningRequests of gangcheck's Karpenter class with NodeClaims.

Every pass (``interval`` seconds) looks at each request of ``KARPENTER_CLASS`` in the cache and
at every NodeClaim labelled with an attempt, decides with
``logic.capacity.karpenter.provisioner.serve`` and applies: creates claims (a lost answer is
answered AlreadyExists on the retry: names are derived from the attempt), writes the request's
conditions at the resourceVersion read, deletes claims conditional on their uid, and removes
``karpenter.sh/do-not-disrupt`` with a JSON patch that tests its value. A request missing from
the cache is looked up live before its claims are withdrawn: a cache cannot prove absence.

Without Karpenter's API (NodeClaims not served, or not readable with gangcheck's rights) a
request of the class fails, saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import (
    AlreadyExistsError,
    ApiError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
)
from gangcheck.kube.resources import NODE, NODE_CLAIM, NODE_POOL, PROVISIONING_REQUEST, Resource
from gangcheck.logic.capacity.karpenter import names
from gangcheck.logic.capacity.karpenter.claims import release_protection_patch
from gangcheck.logic.capacity.karpenter.provisioner import (
    Served,
    is_served_here,
    request_key,
    serve,
)
from gangcheck.logic.timefmt import format_time
from gangcheck.model.objects import Obj
from gangcheck.reconcile.caches import Caches

log = logging.getLogger(__name__)

#: Seconds between passes while requests of the class are in flight.
INTERVAL = 1.0
#: Seconds between passes looking only for claims whose request is gone.
ORPHAN_INTERVAL = 30.0


class KarpenterProvisioner:
    def __init__(
        self,
        kube: Kube,
        caches: Caches,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        interval: float = INTERVAL,
    ) -> None:
        self._kube = kube
        self._caches = caches
        self._clock = clock
        self.interval = interval
        self._since_orphan_pass = ORPHAN_INTERVAL

    async def run(self) -> None:
        while True:
            try:
                await self.pass_once()
            except ApiError as e:
                log.warning("karpenter provisioner pass failed: %s", e)
            await asyncio.sleep(self.interval)
            self._since_orphan_pass += self.interval

    async def pass_once(self) -> None:
        requests = {request_key(r): r for r in self._caches.requests.store if is_served_here(r)}
        if not requests and self._since_orphan_pass < ORPHAN_INTERVAL:
            return
        self._since_orphan_pass = 0.0
        claims = await self._claims()
        if claims is None:
            await self._unserved(requests)
            return
        keys = set(requests) | {_requested_for(c) for c in claims} - {""}
        pools = await self._pools() if requests else {}
        nodes = {n["metadata"]["name"]: n for n in self._caches.nodes.store}
        for key in sorted(keys):
            request = requests.get(key) or await self._live_request(key)
            served = serve(
                request,
                key,
                templates=self._templates(key),
                claims=claims,
                pools=pools,
                nodes=nodes,
                now=self._clock(),
            )
            await self._apply(request, served, claims, nodes)

    async def _claims(self) -> list[Obj] | None:
        try:
            listed = await self._kube.list_objects(NODE_CLAIM, label_selector=names.ATTEMPT_LABEL)
        except (NotFoundError, ForbiddenError):
            return None  # Karpenter's API is not served, or gangcheck may not read it
        return list(listed.get("items") or [])

    async def _pools(self) -> Mapping[str, Obj | None]:
        listed = await self._kube.list_objects(NODE_POOL)
        return {p["metadata"]["name"]: p for p in listed.get("items") or []}

    async def _live_request(self, key: str) -> Obj | None:
        namespace, _, name = key.partition("/")
        return await self._kube.get_if_exists(PROVISIONING_REQUEST, name, namespace)

    def _templates(self, key: str) -> dict[str, Obj]:
        namespace = key.partition("/")[0]
        return {
            t["metadata"]["name"]: t
            for t in self._caches.templates.store
            if t["metadata"].get("namespace") == namespace
        }

    async def _unserved(self, requests: Mapping[str, Obj]) -> None:
        failed = {
            "type": "Failed",
            "status": "True",
            "reason": "KarpenterNotServed",
            "message": (
                "gangcheck cannot list karpenter.sh/v1 NodeClaims: not served, or not "
                "permitted (manifests/components/karpenter)"
            ),
        }
        for request in requests.values():
            await self._write_conditions(request, (failed,))

    async def _apply(
        self, request: Obj | None, served: Served, claims: list[Obj], nodes: Mapping[str, Obj]
    ) -> None:
        for body in served.create:
            with contextlib.suppress(AlreadyExistsError):
                await self._kube.create(NODE_CLAIM, body)
        for claim in served.delete:
            meta = claim["metadata"]
            with contextlib.suppress(NotFoundError, ConflictError):
                await self._kube.delete(NODE_CLAIM, meta["name"], uid=meta.get("uid"))
        if request is not None and served.conditions:
            await self._write_conditions(request, served.conditions)
        by_name = {c["metadata"]["name"]: c for c in claims}
        for kind, name in served.release:
            obj = nodes.get(name) if kind == "node" else by_name.get(name)
            if obj is not None:
                await self._release(NODE if kind == "node" else NODE_CLAIM, obj)
        if served.create or served.delete or served.release:
            log.info(
                "karpenter: %d claims created, %d deleted, %d unprotected",
                len(served.create),
                len(served.delete),
                len(served.release),
                extra={"object": request_key(request) if request else ""},
            )

    async def _write_conditions(self, request: Obj, wanted: tuple[Obj, ...]) -> None:
        meta = request["metadata"]
        now = format_time(self._clock())
        current = list((request.get("status") or {}).get("conditions") or [])
        for condition in wanted:
            old = next((c for c in current if c.get("type") == condition["type"]), None)
            since = (
                old["lastTransitionTime"]
                if old and old.get("status") == condition["status"]
                else now
            )
            new = {**condition, "lastTransitionTime": since}
            current = [c for c in current if c.get("type") != condition["type"]] + [new]
        patch = {
            "metadata": {"resourceVersion": meta["resourceVersion"]},
            "status": {"conditions": current},
        }
        # A conflict: judged on a stale request; the next pass judges again.
        with contextlib.suppress(ConflictError, NotFoundError):
            await self._kube.merge_patch(
                PROVISIONING_REQUEST,
                meta["name"],
                patch,
                meta["namespace"],
                subresource="status",
            )

    async def _release(self, res: Resource, obj: Obj) -> None:
        ops = release_protection_patch(obj)
        if not ops:
            return
        # Gone, or the value changed since it was read (the test op fails: Invalid).
        with contextlib.suppress(NotFoundError, ConflictError, InvalidError):
            await self._kube.json_patch(res, obj["metadata"]["name"], ops)


def _requested_for(claim: Obj) -> str:
    return str(
        ((claim.get("metadata") or {}).get("annotations") or {}).get(names.REQUESTED_FOR, "")
    )
