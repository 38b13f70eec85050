"""What a gang's members ask of nodes, for any gang source: compared, and made explicit."""

from __future__ import annotations

from typing import Any

from gangcheck.model.objects import Obj


def scheduling_requirements(template: Obj) -> tuple[Any, ...]:
    """What the scheduler and the autoscaler look at, as Kueue compares pod sets."""
    spec = template.get("spec") or {}

    def requests(key: str) -> list[Any]:
        return [(c.get("resources") or {}).get("requests") for c in spec.get(key) or []]

    return (
        requests("containers"),
        requests("initContainers"),
        spec.get("resources"),
        spec.get("nodeSelector") or {},
        spec.get("tolerations") or [],
        spec.get("affinity"),
        spec.get("resourceClaims") or [],
    )


def limits_as_missing_requests(container: Obj) -> None:
    """A container's limits copied into its requests where none is set (as the API does)."""
    res = container.get("resources") or {}
    limits = res.get("limits") or {}
    if not limits:
        return
    requests = res.setdefault("requests", {})
    for name, value in limits.items():
        requests.setdefault(name, value)
    container["resources"] = res
