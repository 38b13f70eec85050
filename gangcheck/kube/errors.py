"""Errors of the Kubernetes API, by meaning, each carrying the object and the reason."""

from __future__ import annotations

import json
from typing import Any

_BODY_LIMIT = 500


class ApiError(Exception):
    """The API server answered with an error status (or could not be reached)."""

    def __init__(self, status: int, reason: str, message: str, *, target: str = "") -> None:
        self.status = status
        self.reason = reason
        self.message = message[:_BODY_LIMIT]
        self.target = target
        super().__init__(f"{target}: {status} {reason}: {self.message}" if target else message)


class NotFoundError(ApiError):
    pass


class ConflictError(ApiError):
    """409: a resourceVersion precondition failed or the object changed meanwhile."""


class AlreadyExistsError(ConflictError):
    pass


class GoneError(ApiError):
    """410: a watch's resourceVersion is too old; relist."""


class ForbiddenError(ApiError):
    pass


class InvalidError(ApiError):
    """422: the object failed validation (or a JSON-patch test failed)."""


class TransientError(ApiError):
    """429, 5xx or a broken connection: worth retrying."""


_BY_STATUS: dict[int, type[ApiError]] = {
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    403: ForbiddenError,
    422: InvalidError,
    429: TransientError,
}


def error_from_status(status: int, body: bytes | str, *, target: str = "") -> ApiError:
    """Build the error for an HTTP status and a Status body from the API server."""
    status_obj = _parse(body)
    reason = str(status_obj.get("reason", "")) or str(status)
    message = str(status_obj.get("message", "")) or (
        body.decode() if isinstance(body, bytes) else body
    )
    cls = _BY_STATUS.get(status, TransientError if status >= 500 else ApiError)
    if status == 409 and reason == "AlreadyExists":
        cls = AlreadyExistsError
    return cls(status, reason, message, target=target)


def _parse(body: bytes | str) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
