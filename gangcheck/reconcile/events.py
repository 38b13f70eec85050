"""Kubernetes Events on the objects gangcheck acts for."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from datetime import UTC, datetime

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError
from gangcheck.kube.resources import EVENT
from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.actions import Event
from gangcheck.logic.timefmt import format_time
from gangcheck.model.objects import ObjectRef

log = logging.getLogger(__name__)
MAX_EVENT_MESSAGE = 1024
COMPONENT = "gangcheck"
#: Event creates sent at once by a background recorder.
DEFAULT_SENDERS = 8


class EventRecorder:
    """Creates core/v1 Events; a failure to record is logged, never raised.

    With ``background`` the create is sent by a task of its own (at most ``senders`` at once)
    and `emit` returns at once: the reconcile that decided the Event does not wait a round
    trip for it (an Event is for people; nothing reads it back). Every Event is still sent,
    none dropped; `flush` waits for those under way."""

    def __init__(
        self,
        kube: Kube,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        background: bool = False,
        senders: int = DEFAULT_SENDERS,
    ) -> None:
        self._kube = kube
        self._clock = clock
        self._background = background
        self._senders = asyncio.Semaphore(senders)
        self._sending: set[asyncio.Task[None]] = set()

    @property
    def sending(self) -> int:
        """Events whose create has not been answered yet."""
        return len(self._sending)

    async def flush(self) -> None:
        """Wait until every Event emitted so far was sent (or failed, logged)."""
        while self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)

    async def emit(self, ref: ObjectRef, event: Event) -> None:
        body = self._body(ref, event)
        log.info(event.message, extra={"object": str(ref), "reason": event.reason})
        if not self._background:
            await self._send(ref, event, body)
            return
        task = asyncio.create_task(self._send_one(ref, event, body))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send_one(self, ref: ObjectRef, event: Event, body: dict[str, object]) -> None:
        async with self._senders:
            await self._send(ref, event, body)

    async def _send(self, ref: ObjectRef, event: Event, body: dict[str, object]) -> None:
        try:
            await self._kube.create(EVENT, body)
        except ApiError as e:
            log.warning(
                "could not record event: %s", e, extra={"object": str(ref), "reason": event.reason}
            )

    def _body(self, ref: ObjectRef, event: Event) -> dict[str, object]:
        now = format_time(self._clock())
        body = {
            "metadata": {
                "name": naming.event_name(ref.name, secrets.token_hex(8)),
                "namespace": ref.namespace or "default",
            },
            "involvedObject": {
                "apiVersion": ref.api_version,
                "kind": ref.kind,
                "name": ref.name,
                "namespace": ref.namespace,
                "uid": ref.uid,
            },
            "reason": event.reason,
            "message": event.message[:MAX_EVENT_MESSAGE],
            "type": "Warning" if event.warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        return body
