"""Which PodGroup APIs to use given what discovery found; the watcher's reporting."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping

import pytest

from gangcheck.kube.discovery import PodGroupApiWatcher, ServedPodGroups, choose
from gangcheck.kube.errors import TransientError
from gangcheck.kube.resources import (
    PLUGINS_POD_GROUP,
    UPSTREAM_POD_GROUP_V1ALPHA2,
    UPSTREAM_POD_GROUP_V1BETA1,
)

V1BETA1 = "scheduling.k8s.io/v1beta1"
V1ALPHA2 = "scheduling.k8s.io/v1alpha2"
PLUGINS = "scheduling.x-k8s.io/v1alpha1"
PG = {"podgroups", "podgroups/status"}

BOTH = ServedPodGroups(upstream=UPSTREAM_POD_GROUP_V1BETA1, plugins=PLUGINS_POD_GROUP)
NONE = ServedPodGroups()

CASES: list[tuple[str, Mapping[str, Collection[str]], ServedPodGroups]] = [
    ("nothing served", {}, NONE),
    ("v1 only (priorityclasses)", {"scheduling.k8s.io/v1": {"priorityclasses"}}, NONE),
    ("v1beta1", {V1BETA1: PG | {"workloads"}}, ServedPodGroups(UPSTREAM_POD_GROUP_V1BETA1)),
    ("v1alpha2", {V1ALPHA2: PG}, ServedPodGroups(UPSTREAM_POD_GROUP_V1ALPHA2)),
    (
        "v1beta1 preferred over v1alpha2",
        {V1ALPHA2: PG, V1BETA1: PG},
        ServedPodGroups(UPSTREAM_POD_GROUP_V1BETA1),
    ),
    (
        "v1beta1 without podgroups (gate off): v1alpha2",
        {V1BETA1: {"workloads"}, V1ALPHA2: PG},
        ServedPodGroups(UPSTREAM_POD_GROUP_V1ALPHA2),
    ),
    ("v1beta1 version with no resources", {V1BETA1: set()}, NONE),
    ("plugins only", {PLUGINS: PG}, ServedPodGroups(plugins=PLUGINS_POD_GROUP)),
    ("upstream and plugins", {V1BETA1: PG, PLUGINS: PG}, BOTH),
    (
        "all three: one upstream version",
        {V1BETA1: PG, V1ALPHA2: PG, PLUGINS: PG},
        BOTH,
    ),
    ("plugins group, other resource only", {PLUGINS: {"elasticquotas"}}, NONE),
    ("plugins at another version", {"scheduling.x-k8s.io/v1alpha2": PG}, NONE),
    ("podgroups in a look-alike group", {"scheduling.example.com/v1beta1": PG}, NONE),
]


@pytest.mark.parametrize(("served", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_choose(served: Mapping[str, Collection[str]], expected: ServedPodGroups) -> None:
    assert choose(served) == expected


def test_served_pod_groups_in_words() -> None:
    assert BOTH.resources == (UPSTREAM_POD_GROUP_V1BETA1, PLUGINS_POD_GROUP)
    assert str(BOTH) == "scheduling.k8s.io/v1beta1, scheduling.x-k8s.io/v1alpha1"
    assert str(ServedPodGroups(plugins=PLUGINS_POD_GROUP)) == "scheduling.x-k8s.io/v1alpha1"
    assert NONE.resources == ()
    assert str(NONE) == "none"


class FakeDiscovery:
    """Answers (or failures) in turn; sets `done` once all were given (then repeats the last)."""

    def __init__(self, *answers: ServedPodGroups | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0
        self.done = asyncio.Event()

    async def __call__(self) -> ServedPodGroups:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if self.calls >= len(self.answers):
            self.done.set()
        if isinstance(answer, Exception):
            raise answer
        return answer


async def _run_until_done(
    discovery: FakeDiscovery, watcher: PodGroupApiWatcher, seen: list[ServedPodGroups]
) -> None:
    async def record(served: ServedPodGroups) -> None:
        seen.append(served)

    task = asyncio.create_task(watcher.run(record, interval=0))
    try:
        await asyncio.wait_for(discovery.done.wait(), timeout=5)
        await asyncio.sleep(0)  # let the last answer be handled
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_watcher_reports_the_first_answer_and_each_change() -> None:
    upstream = ServedPodGroups(upstream=UPSTREAM_POD_GROUP_V1BETA1)
    discovery = FakeDiscovery(NONE, NONE, upstream, upstream, BOTH, upstream, upstream)
    watcher = PodGroupApiWatcher(discovery)
    seen: list[ServedPodGroups] = []
    await _run_until_done(discovery, watcher, seen)
    assert seen == [NONE, upstream, BOTH, upstream]
    assert watcher.current == upstream


async def test_watcher_survives_failed_discovery(caplog: pytest.LogCaptureFixture) -> None:
    broken = TransientError(503, "ServiceUnavailable", "etcd is down", target="/apis")
    discovery = FakeDiscovery(broken, BOTH, broken, BOTH, broken, NONE)
    watcher = PodGroupApiWatcher(discovery)
    seen: list[ServedPodGroups] = []
    with caplog.at_level(logging.WARNING, logger="gangcheck.kube.discovery"):
        await _run_until_done(discovery, watcher, seen)
    assert seen == [BOTH, NONE]  # a failure is not an answer: no change reported for it
    assert discovery.calls >= 6
    failures = [r for r in caplog.records if "discovery failed" in r.getMessage()]
    assert len(failures) == 3
    assert "etcd is down" in failures[0].getMessage()


async def test_watcher_offers_an_answer_again_when_on_change_fails() -> None:
    discovery = FakeDiscovery(BOTH, BOTH, BOTH)
    watcher = PodGroupApiWatcher(discovery)
    offered: list[ServedPodGroups] = []

    async def flaky(served: ServedPodGroups) -> None:
        offered.append(served)
        if len(offered) == 1:
            raise RuntimeError("handler not ready")

    assert not await watcher.poll(flaky)
    assert watcher.current is None
    assert await watcher.poll(flaky)
    assert watcher.current == BOTH
    assert not await watcher.poll(flaky)  # unchanged: not offered again
    assert offered == [BOTH, BOTH]


async def test_watcher_waits_the_interval_between_rounds() -> None:
    discovery = FakeDiscovery(NONE)
    watcher = PodGroupApiWatcher(discovery)

    async def ignore(_: ServedPodGroups) -> None:
        return None

    task = asyncio.create_task(watcher.run(ignore, interval=3600))
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert discovery.calls == 1
