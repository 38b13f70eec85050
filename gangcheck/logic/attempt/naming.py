"""Names of the objects gangcheck creates: Kueue's names while they fit, valid names always.

Short names are Kueue's (``{workload}-{check}-{attempt}``, ``ppt-{request}-{podSet}``).
A name that would pass 253 characters keeps its distinguishing tail (the attempt number, the
pod set, the event's token) whole and cuts its head, dropping any ``-`` or ``.`` the cut
leaves at the end and adding 8 hex characters of the whole head's SHA-1. So every name is a
valid DNS subdomain (each dot-separated part starts and ends with a letter or digit) for
any valid Workload, check and pod set name, and attempts of one Workload never share a name.
(Kueue cuts at a fixed length and appends ``-hash``: a cut just after a ``.`` leaves
``x.-hash``, which the API server refuses.)
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection

MAX_NAME = 253
HASH_LENGTH = 8
TEMPLATE_PREFIX = "ppt"


def fit(head: str, tail: str, *, limit: int = MAX_NAME) -> str:
    """``head + tail`` if it fits in `limit`; else the head cut, trimmed and hashed."""
    if len(head) + len(tail) <= limit:
        return head + tail
    digest = hashlib.sha1(head.encode(), usedforsecurity=False).hexdigest()[:HASH_LENGTH]
    room = limit - len(tail) - HASH_LENGTH - 1
    cut = head[:room].rstrip("-.")
    return f"{cut}-{digest}{tail}" if cut else f"{digest}{tail}"


def request_name(workload: str, check: str, attempt: int, source: int = 0) -> str:
    """Kueue's name for the first capacity source's request of an attempt; a later source's
    (spec.capacitySources) adds ``-s<index>``, which no first source's name ends with."""
    tail = f"-{attempt}" if source == 0 else f"-{attempt}-s{source}"
    return fit(f"{workload}-{check}", tail)


#: The most capacity sources one attempt asks (spec.capacitySources' limit).
MAX_SOURCES = 8
#: The most asks one attempt makes (sources, and topology domains within them): the next
#: place after the last is not asked; the attempt ends as when no place is left.
MAX_ASKS = 32


def current_request(
    existing: Collection[str], workload: str, check: str, attempt: int
) -> tuple[str, int]:
    """The request of an attempt in flight among the `existing` names, with its capacity
    source: the latest source asked; the first source's name when none exists yet."""
    for ask in reversed(range(MAX_ASKS)):
        name = request_name(workload, check, attempt, ask)
        if name in existing:
            return name, ask
    return request_name(workload, check, attempt), 0


def template_name(request: str, pod_set: str) -> str:
    return fit(f"{TEMPLATE_PREFIX}-{request}", f"-{pod_set}")


def event_name(object_name: str, token: str) -> str:
    """An Event's name: the object's name, then a unique token (as client-go names them)."""
    return fit(object_name, f".{token}")


def attempt_of(name: str, workload: str, check: str) -> int | None:
    """The attempt number a request name carries for this workload and check, if it is one."""
    match = re.fullmatch(r"(.*)-([0-9]+)(?:-s([0-9]+))?", name)
    if match is None:
        return None
    attempt, source = int(match.group(2)), int(match.group(3) or 0)
    return attempt if request_name(workload, check, attempt, source) == name else None
