"""Which config an AdmissionCheck of ours points at, and whether the check is Active."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gangcheck.model.provisioning_config import AtomicProvisioningSpec, parse_spec

CONTROLLER_NAME = "gangcheck.io/atomic-provisioning"
KUEUE_PROVISIONING = "kueue.x-k8s.io/provisioning-request"
"""Kueue's built-in ProvisioningRequest check: its pods consume a request too."""
CONFIG_GROUP = "gangcheck.io"
CONFIG_KIND = "AtomicProvisioningConfig"

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resolution:
    """The validated config of a check, or why there is none."""

    spec: AtomicProvisioningSpec | None
    reason: str
    message: str

    @property
    def active(self) -> bool:
        return self.spec is not None


def is_ours(admission_check: Obj) -> bool:
    return bool((admission_check.get("spec") or {}).get("controllerName") == CONTROLLER_NAME)


def provisions(admission_check: Obj) -> bool:
    """A check whose Ready pod sets consume a ProvisioningRequest (ours or Kueue's)."""
    name = (admission_check.get("spec") or {}).get("controllerName")
    return name in (CONTROLLER_NAME, KUEUE_PROVISIONING)


def resolve(admission_check: Obj | None, get_config: Callable[[str], Obj | None]) -> Resolution:
    """Resolve and validate the AdmissionCheck's parameters reference."""
    if admission_check is None:
        return Resolution(None, "NotFound", "the AdmissionCheck does not exist")
    ref = (admission_check.get("spec") or {}).get("parameters")
    if not ref:
        return Resolution(AtomicProvisioningSpec(), "Active", "no parameters: using defaults")
    if ref.get("apiGroup") != CONFIG_GROUP or ref.get("kind") != CONFIG_KIND:
        got = f"{ref.get('apiGroup', '')}/{ref.get('kind', '')}"
        return Resolution(
            None,
            "BadParametersRef",
            f"parameters must reference {CONFIG_GROUP}/{CONFIG_KIND}, not {got}",
        )
    config = get_config(str(ref.get("name", "")))
    if config is None:
        return Resolution(
            None, "BadParametersRef", f"{CONFIG_KIND} {ref.get('name', '')!r} not found"
        )
    try:
        spec = parse_spec(config.get("spec"))
    except ValueError as e:
        return Resolution(None, "InvalidConfig", f"{CONFIG_KIND} {ref['name']!r}: {e}")
    return Resolution(spec, "Active", "the admission check is active")


def active_condition(
    resolution: Resolution, generation: int, now: str, previous: Obj | None
) -> Obj:
    """The Active condition to hold; keeps lastTransitionTime when the status stays."""
    status = "True" if resolution.active else "False"
    reason = "Active" if resolution.active else resolution.reason
    message = resolution.message if not resolution.active else "The admission check is active"
    since = (
        previous.get("lastTransitionTime") if previous and previous.get("status") == status else now
    )
    return {
        "type": "Active",
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "observedGeneration": generation,
        "lastTransitionTime": since,
    }
