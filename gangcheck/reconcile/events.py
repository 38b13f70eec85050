"""Kubernetes Events on the objects gangcheck acts for."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
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
#: An Event said again within this many seconds of its last create is counted, not sent.
REPEAT_SECONDS = 300.0
#: The Events a recorder remembers for that (the least recently said forgotten first).
REMEMBERED = 4096

Key = tuple[str, str, str, str, str, str, str]


@dataclass
class Said:
    """One Event as said so far: when first, how often, and when last created."""

    first: datetime
    count: int = 0
    created: datetime | None = None


def one_line(message: str) -> str:
    """The message on one line (an API error's body may span several), cut to the limit."""
    return " ".join(message.split())[:MAX_EVENT_MESSAGE]


def repeated(said: Said, now: datetime) -> bool:
    """Whether an Event said before is only counted now: its last create is recent."""
    return said.created is not None and (now - said.created).total_seconds() < REPEAT_SECONDS


class EventRecorder:
    """Creates core/v1 Events; a failure to record is logged, never raised.

    The same Event (object, reason, type, message) said again within `REPEAT_SECONDS` of its
    last create is counted, not created: a gang stuck on the same refusal, retried, makes one
    Event every few minutes, not one per retry. The next create after that carries the
    count and the first time (``count``, ``firstTimestamp``), as the Events kubectl shows
    aggregated do; the API server forgets Events after an hour anyway.

    With ``background`` the create is sent by a task of its own (at most ``senders`` at once)
    and `emit` returns at once: the reconcile that decided the Event does not wait a round
    trip for it (an Event is for people; nothing reads it back). Every Event is still sent
    (a repeat by the count of the next), none dropped; `flush` waits for those under way."""

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
        self._said: OrderedDict[Key, Said] = OrderedDict()

    @property
    def sending(self) -> int:
        """Events whose create has not been answered yet."""
        return len(self._sending)

    async def flush(self) -> None:
        """Wait until every Event emitted so far was sent (or failed, logged)."""
        while self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)

    async def emit(self, ref: ObjectRef, event: Event) -> None:
        now = self._clock()
        said = self._count(ref, event, now)
        extra = {"object": str(ref), "reason": event.reason, "count": said.count}
        if repeated(said, now):  # logged as quietly as it is recorded
            log.debug(event.message, extra=extra)
            return
        log.info(event.message, extra=extra)
        said.created = now
        body = self._body(ref, event, said, now)
        if not self._background:
            await self._send(ref, event, body, said)
            return
        task = asyncio.create_task(self._send_one(ref, event, body, said))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    def _count(self, ref: ObjectRef, event: Event, now: datetime) -> Said:
        """This Event said once more: its count so far (the oldest remembered forgotten)."""
        message = one_line(event.message)
        kind = "Warning" if event.warning else "Normal"
        key = (ref.kind, ref.namespace, ref.name, ref.uid, event.reason, kind, message)
        said = self._said.pop(key, None) or Said(first=now)
        said.count += 1
        self._said[key] = said
        while len(self._said) > REMEMBERED:
            self._said.popitem(last=False)
        return said

    async def _send_one(
        self, ref: ObjectRef, event: Event, body: dict[str, object], said: Said
    ) -> None:
        async with self._senders:
            await self._send(ref, event, body, said)

    async def _send(
        self, ref: ObjectRef, event: Event, body: dict[str, object], said: Said
    ) -> None:
        try:
            await self._kube.create(EVENT, body)
        except ApiError as e:
            said.created = None  # not said after all: the next repeat is sent
            log.warning(
                "could not record event: %s", e, extra={"object": str(ref), "reason": event.reason}
            )

    def _body(self, ref: ObjectRef, event: Event, said: Said, at: datetime) -> dict[str, object]:
        name = naming.event_name(ref.name, secrets.token_hex(8))
        return event_body(ref, event, name=name, first=said.first, last=at, count=said.count)


def event_body(
    ref: ObjectRef, event: Event, *, name: str, first: datetime, last: datetime, count: int = 1
) -> dict[str, object]:
    """The Event object gangcheck creates for `event` on `ref`, named `name` (the recorder's
    own are named at random; one named for what it says is made once: nodes.py)."""
    return {
        "metadata": {"name": name, "namespace": ref.namespace or "default"},
        "involvedObject": {
            "apiVersion": ref.api_version,
            "kind": ref.kind,
            "name": ref.name,
            "namespace": ref.namespace,
            "uid": ref.uid,
        },
        "reason": event.reason,
        "message": one_line(event.message),
        "type": "Warning" if event.warning else "Normal",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": COMPONENT,
        "firstTimestamp": format_time(first),
        "lastTimestamp": format_time(last),
        "count": count,
    }
