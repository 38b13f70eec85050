"""Kubernetes Events on the objects gangcheck acts for."""

from __future__ import annotations

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


class EventRecorder:
    """Creates core/v1 Events; a failure to record is logged, never raised."""

    def __init__(
        self, kube: Kube, *, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self._kube = kube
        self._clock = clock

    async def emit(self, ref: ObjectRef, event: Event) -> None:
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
        try:
            await self._kube.create(EVENT, body)
        except ApiError as e:
            log.warning(
                "could not record event: %s", e, extra={"object": str(ref), "reason": event.reason}
            )
        log.info(event.message, extra={"object": str(ref), "reason": event.reason})
