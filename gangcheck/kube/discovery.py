"""Which PodGroup APIs the API server serves, asked of discovery and asked again periodically.

Two kinds of PodGroup exist: the upstream one (``scheduling.k8s.io``, v1beta1 or the older
v1alpha2; at most one of them is used, v1beta1 preferred) and the scheduler-plugins
coscheduling CRD (``scheduling.x-k8s.io/v1alpha1``). Discovery is asked directly: first
``/apis/<group>`` (404: the group is not served), then ``/apis/<group>/<version>`` for the
versions of interest it lists. A version counts only when its resource list names
``podgroups``: a group version can be enabled while the feature gate serving PodGroup is off.

The answer can change while gangcheck runs (a CRD installed or removed, an API server
upgraded or reconfigured): ``PodGroupApiWatcher`` re-asks every interval and reports changes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import (
    PLUGINS_POD_GROUP,
    UPSTREAM_POD_GROUP_V1ALPHA2,
    UPSTREAM_POD_GROUP_V1BETA1,
    Resource,
)

log = logging.getLogger(__name__)

#: The upstream PodGroup versions gangcheck speaks, most preferred first.
UPSTREAM_POD_GROUPS = (UPSTREAM_POD_GROUP_V1BETA1, UPSTREAM_POD_GROUP_V1ALPHA2)
#: Every PodGroup resource discovery looks for.
POD_GROUP_CANDIDATES = (*UPSTREAM_POD_GROUPS, PLUGINS_POD_GROUP)


@dataclass(frozen=True)
class ServedPodGroups:
    """The PodGroup APIs to use: one upstream version (or none) and the plugins CRD (or not)."""

    upstream: Resource | None = None
    plugins: Resource | None = None

    @property
    def resources(self) -> tuple[Resource, ...]:
        """The served PodGroup resources, upstream first."""
        return tuple(r for r in (self.upstream, self.plugins) if r is not None)

    def __str__(self) -> str:
        return ", ".join(r.api_version for r in self.resources) or "none"


Discover = Callable[[], Awaitable[ServedPodGroups]]
OnChange = Callable[[ServedPodGroups], Awaitable[None]]


def choose(served: Mapping[str, Collection[str]]) -> ServedPodGroups:
    """The PodGroup APIs to use, given ``group/version -> resource names it serves``.

    Upstream: v1beta1 when it serves podgroups, else v1alpha2 when that does, else none.
    """

    def serves(res: Resource) -> bool:
        return res.plural in served.get(res.api_version, ())

    upstream = next((res for res in UPSTREAM_POD_GROUPS if serves(res)), None)
    return ServedPodGroups(
        upstream=upstream, plugins=PLUGINS_POD_GROUP if serves(PLUGINS_POD_GROUP) else None
    )


async def served_pod_group_apis(kube: Kube) -> ServedPodGroups:
    """Asks discovery which PodGroup APIs ``kube``'s server serves (see module doc).

    A group or version answered with 404 is not served; other errors are raised.
    """
    return choose(await served_resources(kube, POD_GROUP_CANDIDATES))


async def served_resources(kube: Kube, candidates: Iterable[Resource]) -> dict[str, set[str]]:
    """``group/version -> resource names`` for the candidates' group versions served."""
    by_group: dict[str, list[str]] = {}
    for res in candidates:
        by_group.setdefault(res.group, []).append(res.version)
    served: dict[str, set[str]] = {}
    for group, versions in by_group.items():
        document = await _get_or_none(kube, f"/apis/{group}")
        if document is None:
            continue
        listed = {str(v.get("version")) for v in _mappings(document.get("versions"))}
        for version in (v for v in versions if v in listed):
            listing = await _get_or_none(kube, f"/apis/{group}/{version}")
            if listing is not None:
                served[f"{group}/{version}"] = _resource_names(listing)
    return served


async def serves(kube: Kube, res: Resource) -> bool:
    """Whether ``kube``'s server lists ``res`` in its group version's discovery document (a
    404 there: not served). Other errors are raised: the answer is not known."""
    path = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
    listing = await _get_or_none(kube, path)
    return listing is not None and res.plural in _resource_names(listing)


def _resource_names(listing: Mapping[str, Any]) -> set[str]:
    """The resource names (plurals, subresources too) a group version's document lists."""
    return {str(r.get("name")) for r in _mappings(listing.get("resources"))}


async def _get_or_none(kube: Kube, path: str) -> dict[str, Any] | None:
    try:
        return await kube.request("GET", path)
    except NotFoundError:
        return None


def _mappings(value: object) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


class PodGroupApiWatcher:
    """Asks ``discover`` at start and every interval; reports the first answer and each change.

    A failed discovery, or an ``on_change`` that raises, is logged and retried at the next
    interval (an answer ``on_change`` did not accept is offered again); ``run`` only ends
    when cancelled.
    """

    def __init__(self, discover: Discover) -> None:
        self._discover = discover
        self._current: ServedPodGroups | None = None

    @classmethod
    def for_kube(cls, kube: Kube) -> PodGroupApiWatcher:
        """A watcher asking ``kube``'s server (``served_pod_group_apis``)."""
        return cls(lambda: served_pod_group_apis(kube))

    @property
    def current(self) -> ServedPodGroups | None:
        """The last answer ``on_change`` accepted; None before the first."""
        return self._current

    async def run(self, on_change: OnChange, interval: float = 60.0) -> None:
        while True:
            await self.poll(on_change)
            await asyncio.sleep(interval)

    async def poll(self, on_change: OnChange) -> bool:
        """One discovery; calls ``on_change`` when the answer differs from ``current``.
        Returns whether ``current`` changed."""
        try:
            served = await self._discover()
        except Exception as e:
            log.warning("PodGroup API discovery failed (retrying at the next interval): %s", e)
            return False
        if served == self._current:
            return False
        try:
            await on_change(served)
        except Exception:
            log.exception("handling the served PodGroup APIs (%s) failed; retrying", served)
            return False
        log.info("PodGroup APIs served: %s (was %s)", served, self._current or "unknown")
        self._current = served
        return True
