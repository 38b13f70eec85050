"""Names of the objects gangcheck creates, as Kueue names them, cut and hashed past 253."""

from __future__ import annotations

import hashlib
import re

MAX_NAME = 253
_PREFIX_LIMIT = 247
_HASH_LENGTH = 5
TEMPLATE_PREFIX = "ppt"


def limit_name(full: str) -> str:
    """Keep a name within 253 characters: cut at 247 and add 5 hex chars of its SHA-1."""
    if len(full) <= _PREFIX_LIMIT:
        return full
    digest = hashlib.sha1(full.encode(), usedforsecurity=False).hexdigest()
    return f"{full[:_PREFIX_LIMIT]}-{digest[:_HASH_LENGTH]}"


def request_name(workload: str, check: str, attempt: int) -> str:
    return limit_name(f"{workload}-{check}-{attempt}")


def template_name(request: str, pod_set: str) -> str:
    return limit_name(f"{TEMPLATE_PREFIX}-{request}-{pod_set}")


def attempt_of(name: str, workload: str, check: str) -> int | None:
    """The attempt number a request name carries for this workload and check, if it is one."""
    prefix = limit_name(f"{workload}-{check}-")
    match = re.fullmatch(re.escape(prefix) + r"([0-9]+)", name)
    return int(match.group(1)) if match else None
