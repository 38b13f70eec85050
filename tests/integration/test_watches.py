"""Watches and retries under faults: relist only on 410, resume a cut watch, notice a stalled
one, back off with jitter, wait as long as Retry-After asks, say whether the cache is current.

Real kube-apiserver behind the fault-injecting proxy (tests/faults/proxy.py): the cuts, stalls,
410s, 500s and 429s are the proxy's; the objects and resourceVersions are the server's. And an
answer of gangcheck's write read only after the watch brought the object's deletion: the
cache does not take the deleted object back (the controller's own calls, held by the test).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import Kube
from gangcheck.kube.informer import Informer
from gangcheck.kube.resources import WORKLOAD, Resource
from tests.builders import WorkloadBuilder, pod_template
from tests.faults.proxy import STALL, STATUS, FaultProxy, Faults, Rule
from tests.integration.harness import TRUST, Cluster, RunningController, eventually, req_name
from tests.waiting import cancelled

pytestmark = pytest.mark.integration
CONFIG_MAP = Resource("", "v1", "configmaps", "ConfigMap")


@pytest.fixture
async def faults() -> Faults:
    return Faults()


@pytest.fixture
async def proxy(control_plane: ControlPlane, faults: Faults) -> AsyncIterator[FaultProxy]:
    # The client's watches are under test, on ConfigMaps: as the admin, not gangcheck's account.
    proxy = FaultProxy(control_plane.kubeconfig, faults, replica="gangcheck", identity=None)
    started = await proxy.start()
    yield started
    faults.enabled = False
    await started.stop()


@pytest.fixture
async def proxied_kube(proxy: FaultProxy, tmp_path: Path) -> AsyncIterator[Kube]:
    async with await Kube.connect(str(proxy.kubeconfig(tmp_path / "k.kubeconfig"))) as kube:
        yield kube


@contextlib.asynccontextmanager
async def running(informer: Informer) -> AsyncIterator[Informer]:
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 20)
        yield informer
    finally:
        await cancelled(task)


def config_maps(kube: Kube, cluster: Cluster, **kw: float) -> Informer:
    """An informer of this test's ConfigMaps (a label only they carry), long watches."""
    return Informer(kube, CONFIG_MAP, label_selector=f"test={cluster.ns}", watch_timeout=300, **kw)


async def make(kube: Kube, cluster: Cluster, name: str) -> None:
    body = {"metadata": {"name": name, "namespace": cluster.ns, "labels": {"test": cluster.ns}}}
    await kube.create(CONFIG_MAP, body)


def seen(informer: Informer, cluster: Cluster, name: str) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return informer.store.get(name, cluster.ns) is not None

    return probe


def lists(faults: Faults) -> int:
    return sum(1 for c in faults.calls if c.method == "GET" and c.path.endswith("/configmaps"))


async def test_a_cut_watch_resumes_from_its_resource_version_without_a_relist(
    kube: Kube, proxied_kube: Kube, proxy: FaultProxy, faults: Faults, cluster: Cluster
) -> None:
    """Before: any broken watch relisted everything. Now only 410 does; the changes made
    while the watch was down still arrive (the watch resumes from the last version seen)."""
    async with running(config_maps(proxied_kube, cluster, retry_delay=0.2)) as informer:
        for i in range(3):
            await eventually(lambda: _async(proxy.cut(r"/configmaps$") > 0), what="a watch")
            await make(kube, cluster, f"cm{i}")
            await eventually(seen(informer, cluster, f"cm{i}"), what=f"cm{i} seen")
        assert informer.relists == 0
        assert lists(faults) == 1


async def test_a_watch_answered_410_relists(
    kube: Kube, proxied_kube: Kube, proxy: FaultProxy, faults: Faults, cluster: Cluster
) -> None:
    async with running(config_maps(proxied_kube, cluster, retry_delay=0.2)) as informer:
        faults.rules.append(Rule(STATUS, status=410, path=r"/configmaps$", watch=True, times=1))
        await eventually(lambda: _async(proxy.cut(r"/configmaps$") > 0), what="a watch")
        await make(kube, cluster, "after-410")
        await eventually(seen(informer, cluster, "after-410"), what="seen after the relist")
        assert informer.relists == 1


async def test_a_stalled_watch_is_noticed_within_its_quiet_period(
    kube: Kube, proxied_kube: Kube, proxy: FaultProxy, faults: Faults, cluster: Cluster
) -> None:
    """A watch that answers and then brings nothing, not even a bookmark: before, the cache
    waited for the watch's own end (up to 330 s); now it watches again after `quiet_seconds`."""
    informer = config_maps(proxied_kube, cluster, retry_delay=0.2, quiet_seconds=2)
    async with running(informer):
        faults.rules.append(Rule(STALL, path=r"/configmaps$", watch=True, times=1))
        await eventually(lambda: _async(proxy.cut(r"/configmaps$") > 0), what="a watch")
        await make(kube, cluster, "during-stall")
        await eventually(seen(informer, cluster, "during-stall"), timeout=10, what="seen")
        assert informer.relists == 0


async def test_a_cache_whose_watch_fails_is_not_current_until_watched_again(
    kube: Kube, proxied_kube: Kube, proxy: FaultProxy, faults: Faults, cluster: Cluster
) -> None:
    """While every watch is refused (an apiserver restarting), the cache may miss changes and
    says so; once a watch is answered again and has run a moment, it is current, and holds
    what was made while it was not."""
    async with running(config_maps(proxied_kube, cluster, retry_delay=0.2)) as informer:
        assert informer.current
        refused = Rule(STATUS, status=500, path=r"/configmaps$", watch=True)
        faults.rules.append(refused)

        async def refused_twice() -> bool:
            proxy.cut(r"/configmaps$")  # a watch answered before the rule: cut
            return _refused_watches(faults) >= 2

        await eventually(refused_twice, what="watches refused")
        await make(kube, cluster, "while-refused")
        assert not informer.current  # every watch since the cut was refused: nothing healed
        faults.rules.remove(refused)
        await eventually(lambda: _async(informer.current), timeout=30, what="current again")
        assert informer.store.get("while-refused", cluster.ns) is not None
        assert informer.relists == 0


def _refused_watches(faults: Faults) -> int:
    return sum(1 for _, kind, *_ in faults.log if kind == "500")


async def test_list_failures_back_off_growing_with_jitter(
    proxied_kube: Kube, faults: Faults, cluster: Cluster
) -> None:
    """Three lists failing (each a burst of 500s: the client's own quick retries): before,
    the informer waited a fixed second between them; now its waits double, each drawn at
    random from [ceiling/2, ceiling], so replicas that failed together spread out."""
    attempts = 5  # the client's tries per call
    faults.rules.append(
        Rule(STATUS, status=500, path=r"/configmaps$", watch=False, times=3 * attempts)
    )
    informer = config_maps(proxied_kube, cluster, retry_delay=0.4)
    async with running(informer):
        pass
    times = [t for t, kind, *_ in faults.log if kind == "500"]
    bursts = [times[i : i + attempts] for i in range(0, len(times), attempts)]
    answered = next(c.sent for c in faults.calls if c.path.endswith("/configmaps"))
    starts = [b[0] for b in bursts[1:]] + [answered]
    waits = [start - burst[-1] for burst, start in zip(bursts, starts, strict=True)]
    for wait, (low, high) in zip(waits, [(0.2, 0.4), (0.4, 0.8), (0.8, 1.6)], strict=True):
        assert low <= wait <= high + 0.5, f"waits between failed lists: {waits}"


async def test_retry_after_is_waited_for(
    proxied_kube: Kube, faults: Faults, cluster: Cluster
) -> None:
    """A 429 asking for 2 s: the call is tried again after 2 s, not after the client's own
    0.2 s backoff."""
    faults.rules.append(Rule(STATUS, status=429, retry_after=2, path=r"/configmaps$", times=1))
    await proxied_kube.list_objects(CONFIG_MAP, cluster.ns)
    (throttled,) = [t for t, kind, *_ in faults.log if kind.startswith("429")]
    (answered,) = [c for c in faults.calls if c.path.endswith("/configmaps")]
    assert answered.sent - throttled >= 1.9


async def _async(value: object) -> object:
    return value


async def test_a_first_list_answered_404_of_a_served_resource_is_retried_not_emptied(
    kube: Kube, proxied_kube: Kube, faults: Faults, cluster: Cluster
) -> None:
    """An optional resource that discovery serves, its first list answered 404 (a proxy, a
    server starting): before, the cache was declared not served and empty for a minute,
    and a leader starting then acted on no Workloads at all; now the list is retried with
    the usual backoff and the cache holds what exists."""
    await make(kube, cluster, "before-start")
    faults.rules.append(Rule(STATUS, status=404, path=r"/configmaps$", watch=False, times=1))
    informer = config_maps(proxied_kube, cluster, retry_delay=0.2, optional=True, absent_retry=60)
    async with running(informer):
        assert informer.served and informer.authoritative
        assert informer.store.get("before-start", cluster.ns) is not None
    assert sum(1 for _, kind, *_ in faults.log if kind == "404") == 1


async def test_an_optional_resource_not_served_at_first_is_seen_once_served(
    kube: Kube, proxied_kube: Kube, faults: Faults, cluster: Cluster
) -> None:
    """Discovery itself answered 404 at first (the resource looks not served): the cache is
    empty and synced, and it is listed again soon enough to hold what exists."""
    await make(kube, cluster, "served-later")
    faults.rules.append(Rule(STATUS, status=404, path=r"/configmaps$", watch=False, times=1))
    faults.rules.append(Rule(STATUS, status=404, path=r"^/api/v1$", times=1))
    informer = config_maps(proxied_kube, cluster, retry_delay=0.2, optional=True, absent_retry=2)
    async with running(informer):
        await eventually(seen(informer, cluster, "served-later"), timeout=20, what="listed again")
        assert informer.served and informer.authoritative
    assert sum(1 for _, kind, *_ in faults.log if kind == "404") == 2  # the list, discovery


async def test_a_large_list_arrives_whole_through_the_proxy(
    kube: Kube, proxied_kube: Kube, cluster: Cluster
) -> None:
    """The proxy's own client asked for gzip, which kube-apiserver uses for answers over
    128 KiB, and passed the compressed bytes on without their encoding: the soak's replicas
    could not read a large list (a harness defect, found running `make soak` to its end)."""
    data = {"blob": "x" * 200_000}
    for i in range(2):
        body = {"metadata": {"name": f"big-{i}", "namespace": cluster.ns,
                             "labels": {"test": cluster.ns}}, "data": data}  # fmt: skip
        await kube.create(CONFIG_MAP, body)
    listed = await proxied_kube.list_objects(
        CONFIG_MAP, cluster.ns, label_selector=f"test={cluster.ns}"
    )
    assert [i["data"] for i in listed["items"]] == [data, data]
    async with running(config_maps(proxied_kube, cluster)) as informer:
        assert informer.store.get("big-1", cluster.ns) is not None


# ---- an answer read late: the watch brought the write and then the object's deletion first


async def test_a_workload_deleted_as_its_check_is_written_has_its_request_withdrawn(
    cluster: Cluster, controller: RunningController
) -> None:
    """The API server answers gangcheck's write of the check, the Workload is deleted, and
    the watch brings both before the reconcile reads the answer (held here until it has; in
    a full run under load, test_slices' Job deleted as its slice turned Ready): the answer
    does not put the deleted Workload back in the cache, where it stayed for good, never
    seen gone, its request never withdrawn."""
    assert controller.controller is not None
    kube, store = controller.controller.kube, controller.controller.caches.workloads.store
    name, status = req_name(cluster), WORKLOAD.object_path("wl", cluster.ns) + "/status"
    original = kube.request
    held: list[str] = []

    async def request(method: str, path: str, **kw: Any) -> Any:
        answer = await original(method, path, **kw)
        if method == "PATCH" and path == status and not held and await cluster.request(name):
            held.append(answer["metadata"]["resourceVersion"])
            await cluster.delete_workload("wl")

            async def gone() -> bool:
                return store.get("wl", cluster.ns) is None

            await eventually(gone, what="the watch bringing the Workload's deletion")
        return answer

    kube.request = request  # type: ignore[method-assign]
    await cluster.install_check(TRUST)
    gang = WorkloadBuilder("wl").pod_set("workers", 2, pod_template(gpu=1))
    await cluster.submit(gang.reserve_quota().check())
    await eventually(lambda: _async(bool(held)), what="a check write answered, then deleted")
    await cluster.wait_request_gone(name)
