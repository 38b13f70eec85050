"""Leader election on a coordination.k8s.io/v1 Lease: only the leader reconciles.

As client-go does it: a lease held by another is taken over only once it has not changed for
its whole duration, as observed by our own monotonic clock (so clock skew between replicas
does not matter); every write carries the resourceVersion read, so two candidates can never
both win.

The leader's own writes are fenced (``write_fence``, given to the controller's client): a
write is sent only while the lease is known valid, that is within the renew deadline of the
start of the last successful renew, and with a timeout that ends before the lease could
expire; no other replica can take the lease over before a whole lease duration passes without
a renew. Every lease call is bounded (``call_timeout``), so a renew that hangs never keeps the
leader from noticing. Between the renew deadline and the lease's end the leader stops acting
but keeps trying to renew: an apiserver restart shorter than the lease costs a pause, not the
leadership. A leader that cannot renew within the lease duration stops leading (the caller
exits and the Deployment restarts it); a graceful shutdown releases the lease at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import (
    AlreadyExistsError,
    ApiError,
    ConflictError,
    FencedError,
    NotFoundError,
)
from gangcheck.kube.resources import LEASE
from gangcheck.logic.timefmt import format_micro_time
from gangcheck.model.objects import Obj

log = logging.getLogger(__name__)


MIN_WRITE_SECONDS = 0.1


class LostLeadershipError(Exception):
    """The lease could not be renewed within the lease duration."""


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    """Writes stop when the last successful renew began longer ago than this."""
    retry_period: float = 2.0
    call_timeout: float = 0.0
    """The longest one lease call (read or write) may take; 0: half the renew deadline."""

    def __post_init__(self) -> None:
        if not 0 < self.call_bound < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs call_timeout < renew_deadline < lease_duration, got "
                f"{self.call_bound}, {self.renew_deadline}, {self.lease_duration}"
            )

    @property
    def call_bound(self) -> float:
        return self.call_timeout or self.renew_deadline / 2


class LeaderElector:
    def __init__(
        self, kube: Kube, config: LeaseConfig, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._kube = kube
        self.config = config
        self._monotonic = monotonic
        self._observed_rv = ""
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        """Our monotonic clock when the last successful acquire or renew *began*."""
        self.is_leader = False

    def write_fence(self) -> float:
        """Seconds a write may take from now; FencedError if the lease is not known valid."""
        renewed = self._renewed_at
        if not self.is_leader or renewed is None:
            raise FencedError(f"not the leader of {self._lease_ref}")
        since = self._monotonic() - renewed
        if since >= self.config.renew_deadline:
            raise FencedError(
                f"lease {self._lease_ref} not renewed for {since:.1f}s: not acting until it is"
            )
        return max(MIN_WRITE_SECONDS, self.config.lease_duration - since)

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Wait for the lease, then run `lead` until it returns or leadership is lost."""
        while True:
            if await self._attempt():
                break
            await asyncio.sleep(self.config.retry_period)
        self.is_leader = True
        log.info(
            "became leader", extra={"lease": self._lease_ref, "identity": self.config.identity}
        )
        leading = asyncio.create_task(lead(), name="leading")
        renewing = asyncio.create_task(self._keep_renewing(), name="renewing")
        try:
            done, _ = await asyncio.wait({leading, renewing}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # LostLeadershipError, or whatever ended the leading work
        finally:
            for task in (leading, renewing):
                task.cancel()
            await asyncio.gather(leading, renewing, return_exceptions=True)
            self.is_leader = False
            self._renewed_at = None
            await self.release()

    async def _keep_renewing(self) -> None:
        while True:
            await asyncio.sleep(self.config.retry_period)
            if await self._attempt():
                continue
            renewed = self._renewed_at or 0.0
            if self._monotonic() - renewed >= self.config.lease_duration:
                raise LostLeadershipError(f"could not renew lease {self._lease_ref}")

    async def _attempt(self) -> bool:
        """One bounded try to acquire or renew; on success the lease is valid from its start."""
        began = self._monotonic()
        try:
            async with asyncio.timeout(self.config.call_bound):
                won = await self.try_acquire_or_renew()
        except TimeoutError:
            log.warning("lease call timed out after %.1fs", self.config.call_bound)
            return False
        if won:
            self._renewed_at = began
        return won

    @property
    def _lease_ref(self) -> str:
        return f"{self.config.namespace}/{self.config.name}"

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: create, renew or take over the lease; False if another holds it."""
        try:
            lease = await self._kube.get(LEASE, self.config.name, self.config.namespace)
        except NotFoundError:
            return await self._create()
        except ApiError as e:
            log.warning("reading the lease failed: %s", e)
            return False
        self._observe(lease)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self.config.identity and not self._expired(spec):
            return False
        return await self._write(lease, taking_over=holder != self.config.identity)

    def _observe(self, lease: Obj) -> None:
        rv = lease["metadata"].get("resourceVersion", "")
        if rv != self._observed_rv:
            self._observed_rv, self._observed_at = rv, self._monotonic()

    def _expired(self, spec: Obj) -> bool:
        duration = float(spec.get("leaseDurationSeconds") or self.config.lease_duration)
        return self._monotonic() - self._observed_at > duration

    async def _create(self) -> bool:
        now = format_micro_time(datetime.now(UTC))
        body = {
            "metadata": {"name": self.config.name, "namespace": self.config.namespace},
            "spec": {
                "holderIdentity": self.config.identity,
                "leaseDurationSeconds": int(self.config.lease_duration),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            await self._kube.create(LEASE, body)
        except (AlreadyExistsError, ConflictError):
            return False
        except NotFoundError as e:  # the namespace: say whose, and which setting names it
            why = (
                f"the leader Lease's namespace {self.config.namespace!r} does not exist "
                "(leaderElection.namespace, --lease-namespace): create it or name another; "
                f"the API server said: {e.message}"
            )
            raise NotFoundError(e.status, e.reason, why, details=e.details) from e
        return True

    async def _write(self, lease: Obj, *, taking_over: bool) -> bool:
        now = format_micro_time(datetime.now(UTC))
        spec = dict(lease.get("spec") or {})
        spec.update(holderIdentity=self.config.identity, renewTime=now)
        spec["leaseDurationSeconds"] = int(self.config.lease_duration)
        if taking_over:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        try:
            updated = await self._kube.replace(LEASE, {**lease, "spec": spec})
        except (ConflictError, NotFoundError):
            return False
        except ApiError as e:
            log.warning("writing the lease failed: %s", e)
            return False
        self._observe(updated)
        return True

    async def release(self) -> None:
        """Give the lease up now, if we hold it, so a standby takes over without waiting."""
        with contextlib.suppress(ApiError, OSError, TimeoutError):
            async with asyncio.timeout(self.config.call_bound):
                await self._release()

    async def _release(self) -> None:
        with contextlib.suppress(ApiError, OSError):
            lease = await self._kube.get(LEASE, self.config.name, self.config.namespace)
            if (lease.get("spec") or {}).get("holderIdentity") != self.config.identity:
                return
            spec = {**lease["spec"], "holderIdentity": None, "leaseDurationSeconds": 1}
            await self._kube.replace(LEASE, {**lease, "spec": spec})
            log.info("released the lease", extra={"lease": self._lease_ref})
