"""Errors of the Kubernetes API, by meaning, each carrying the object and the reason."""

from __future__ import annotations

import json
from typing import Any

_BODY_LIMIT = 500


class ApiError(Exception):
    """The API server answered with an error status (or could not be reached)."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        *,
        target: str = "",
        details: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.reason = reason
        self.message = message[:_BODY_LIMIT]
        self.target = target
        self.details = details or {}
        """The Status's details: for a missing object its name and kind; empty when the
        resource itself is not served."""
        self.retry_after = retry_after
        """Seconds the server asked us to wait (Retry-After on a 429 or 503), if it did."""
        super().__init__(f"{target}: {status} {reason}: {self.message}" if target else message)


class NotFoundError(ApiError):
    def names_object(self, name: str) -> bool:
        """True if the server said this very object does not exist (its Status names it);
        False for a resource not served (a CRD absent) or a 404 from anything in between."""
        return str(self.details.get("name", "")) == name


class ConflictError(ApiError):
    """409: a resourceVersion precondition failed or the object changed meanwhile."""


class AlreadyExistsError(ConflictError):
    pass


class ReplacedError(ConflictError):
    """A write carrying the object's uid found another object of that name (`replaced`)."""


class ChangedError(ConflictError):
    """A JSON patch that did not apply to the object as it is now: a ``test`` op failed, or a
    path an op names is gone. The object changed since it was read: read it again and decide
    again (`unapplied`)."""


class GoneError(ApiError):
    """410: a watch's resourceVersion is too old; relist."""


class ForbiddenError(ApiError):
    pass


class InvalidError(ApiError):
    """422: the object failed validation (or a JSON-patch test failed)."""


WEBHOOK_DENIAL = 'admission webhook "'
"""How kube-apiserver begins the message of a write an admission webhook denied, whatever
the status the webhook chose (apiserver's webhook errors.ToStatusErr)."""
VAP_DENIAL = "ValidatingAdmissionPolicy '"
"""How kube-apiserver names a ValidatingAdmissionPolicy that denied a write, whatever the
status its validation chose (``ValidatingAdmissionPolicy 'p' with binding 'b' denied
request: ...``)."""


def refused(error: BaseException) -> bool:
    """Whether the API server refused a write for what it says (its schema, a webhook, a
    policy, RBAC, a quota): a 403; a 422 naming its causes (the schema, a
    ValidatingAdmissionPolicy); a 422 an admission webhook answered, causes or not. Not a
    422 kube-apiserver answers a patch that did not apply, naming no causes (a JSON-patch
    ``test`` that failed: the object changed meanwhile). The one rule for every write,
    made alone or among others at once (`refusal`)."""
    if isinstance(error, ForbiddenError):
        return True
    if not isinstance(error, InvalidError):
        return False
    return bool(error.details.get("causes")) or error.message.startswith(WEBHOOK_DENIAL)


def replaced(error: BaseException) -> bool:
    """Whether a write carrying the object's uid (`Kube.merge_patch(uid=...)`) found another
    object of that name: kube-apiserver answers 422, its one cause the immutable
    ``metadata.uid`` (the object was deleted and made again since it was read)."""
    if not isinstance(error, InvalidError):
        return False
    causes = error.details.get("causes") or []
    return bool(causes) and all(
        isinstance(c, dict) and c.get("field") == "metadata.uid" for c in causes
    )


def unapplied(error: InvalidError, target: str) -> ApiError:
    """What a 422 answering a JSON patch means: a refusal (`refused`: the schema, a webhook,
    a policy) as it is; else the patch did not apply to the object as it is now, a
    ChangedError (a ConflictError: the object changed since it was read). The one reading
    of a JSON patch's 422 (`Kube.json_patch`), so its callers catch ConflictError alone."""
    if refused(error):
        return error
    message = f"changed since it was read: {error.message}"
    return ChangedError(409, "Conflict", message, target=target or error.target)


def by_admission(error: BaseException) -> bool:
    """Whether a 403 was answered by an admission webhook or a ValidatingAdmissionPolicy, not
    by the authorizer (``User "..." cannot create resource ...``: a right missing)."""
    return isinstance(error, ForbiddenError) and (
        error.message.startswith(WEBHOOK_DENIAL) or VAP_DENIAL in error.message
    )


def refused_as_written(error: BaseException) -> bool:
    """Whether the API server refused a write for what the write is (`refused`: its schema,
    an admission webhook or policy), not for the writer's rights: a 403 counts only when
    admission answered it (`by_admission`), never the authorizer's (a right missing, which
    granting it again mends: a refusal of the writer, not of the object)."""
    if isinstance(error, ForbiddenError):
        return by_admission(error)
    return refused(error)


def refusal(error: BaseException, *, also: tuple[type[ApiError], ...] = ()) -> ApiError | None:
    """`error` when it is a write refused for what it says (`refused`, or one of the types
    `also`: what the caller found refused itself, a name taken); None otherwise. Of writes
    made at once, the caller passes the first that failed (`runtime/together.at_once`)."""
    if isinstance(error, ApiError) and (isinstance(error, also) or refused(error)):
        return error
    return None


class TransientError(ApiError):
    """429, 5xx or a broken connection: worth retrying."""


class FencedError(ApiError):
    """A write refused before it was sent: this replica does not hold a lease known to be
    valid (runtime/leader.py), so it must not act."""

    def __init__(self, message: str, *, target: str = "") -> None:
        super().__init__(0, "NotLeader", message, target=target)


_BY_STATUS: dict[int, type[ApiError]] = {
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    403: ForbiddenError,
    422: InvalidError,
    429: TransientError,
}


def error_from_status(
    status: int, body: bytes | str, *, target: str = "", retry_after: str | None = None
) -> ApiError:
    """Build the error for an HTTP status, a Status body and a Retry-After header, if any."""
    status_obj = _parse(body)
    reason = str(status_obj.get("reason", "")) or str(status)
    message = str(status_obj.get("message", "")) or (
        body.decode() if isinstance(body, bytes) else body
    )
    cls = _BY_STATUS.get(status, TransientError if status >= 500 else ApiError)
    if status == 409 and reason == "AlreadyExists":
        cls = AlreadyExistsError
    details = status_obj.get("details")
    return cls(
        status,
        reason,
        message,
        target=target,
        details=details if isinstance(details, dict) else None,
        retry_after=_seconds(retry_after),
    )


def _seconds(raw: str | None) -> float | None:
    """Retry-After in seconds (the API server sends whole seconds; an HTTP date is ignored)."""
    try:
        return max(0.0, float(raw)) if raw else None
    except ValueError:
        return None


def _parse(body: bytes | str) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
