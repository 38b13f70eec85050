"""Session-wide: the soak split, the workers' groups, the measurements shown at the end, and
a green run leaves no temp folder behind.

Tests marked ``soak`` (the long scenarios: more seeds, long waits, comparisons) run in
``make soak`` (``GANGCHECK_SOAK=1``) and only there; every other test runs in ``make test``
and only there. docs/testing.md lists what runs where and why.

``make test`` runs on three workers (pytest-xdist, ``--dist loadscope`` with the scopes of
`worker_group`): what shares a started stack runs on one worker, so each stack starts once.
The e2e tests on the session's full stack are one group, each folder of tests/e2e (a stack of
its own: Karpenter's, the clusters') one, and every other module a group of its own (its
module-scoped fixtures start once). The groups that start a stack of their own (the e2e groups)
are handed out first, then the integration and dev tooling modules, the unit modules last:
pytest-xdist orders groups by their number of tests, which would leave a minute-long group of
four tests to start near the end of the run.

Hypothesis times each example of a property (200 ms by default): on a loaded machine that
fails a property whose logic holds, so the suite's profile has no such deadline (the tests'
own timeouts bound them).

pytest removes a green session's temp folders itself (``tmp_path_retention_policy`` in
pyproject.toml) but keeps the per-user folder it makes them in; that one goes too once empty.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

hypothesis_settings.register_profile("gangcheck", deadline=None)
hypothesis_settings.load_profile("gangcheck")

SOAK_ENV = "GANGCHECK_SOAK"
MEASUREMENTS = pytest.StashKey[list[str]]()
_WORKER_OUTPUT = "measurements"


def soak() -> bool:
    """This session is `make soak`'s."""
    return os.environ.get(SOAK_ENV) == "1"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect (never skip) the other half of the split, before the other conftests' hooks
    build binaries or the image for the tests kept."""
    wanted = soak()
    kept, dropped = [], []
    for item in items:
        (kept if (item.get_closest_marker("soak") is not None) == wanted else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


#: Modules of tests/e2e that start a stack of their own (not the session's full stack).
OWN_STACK = frozenset(
    {
        "test_kind_deploy.py",
        "test_bench.py",
        "test_bench_capacity_sources.py",
        "test_bench_elastic.py",
    }
)


def worker_group(nodeid: str) -> str:
    """The group a test runs in (module doc): tests/e2e's tests on the session's full stack
    together, each folder below tests/e2e (a stack of its own) together, any other module by
    itself. `nodeid` is relative to the repository's root."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if parts[:2] != ["tests", "e2e"] or len(parts) < 3:
        return path
    if len(parts) > 3:
        return "/".join(parts[:3])
    return path if parts[2] in OWN_STACK else "tests/e2e"


def group_order(group: str, tests: int) -> tuple[int, int]:
    """Sort key of a group (`worker_group`) of `tests` tests: the e2e groups first (each starts
    a stack and runs for minutes), then tests/integration and hack/devtools/tests, tests/unit
    last; within each, the larger first."""
    if group.startswith("tests/e2e"):
        kind = 0
    elif group.startswith("tests/unit/"):
        kind = 2
    else:
        kind = 1
    return kind, -tests


def in_order(scopes: dict[str, int]) -> list[str]:
    """The groups (`worker_group`; each with its number of tests) in the order the workers
    take them: `group_order`, those of one rank in the order collected."""
    return sorted(scopes, key=lambda g: group_order(g, scopes[g]))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope`` with `worker_group` as the scope (pytest-xdist's own
    ``loadgroup`` does not group under this pytest) and the groups in `in_order`."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByStack(LoadScopeScheduling):  # type: ignore[misc]
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            """Before the first unit is handed out, the queue of groups put `in_order`. Only
            the queue: each worker runs the tests of a unit by their index in the collection
            it made, so the collections are left in the order collected (reordering them had
            every worker run the test at that index of its own, scattering each group over
            all the workers, a stack started by each)."""
            if not self.ordered:
                self.ordered = True
                units = dict(self.workqueue)
                self.workqueue.clear()
                for scope in in_order({scope: len(unit) for scope, unit in units.items()}):
                    self.workqueue[scope] = units[scope]
            super()._assign_work_unit(node)

    return ByStack(config, log)


def pytest_configure(config: pytest.Config) -> None:
    config.stash[MEASUREMENTS] = []


def measurements(config: pytest.Config) -> list[str]:
    """Lines the session shows at its end (stack start-up, image build), whatever worker ran
    the test that measured them."""
    return config.stash[MEASUREMENTS]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """A worker's measurements, handed to the session that shows them."""
    sent = getattr(node, "workeroutput", {}).get(_WORKER_OUTPUT, [])
    config: pytest.Config = node.config  # type: ignore[attr-defined]
    measurements(config).extend(sent)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = measurements(terminalreporter.config)
    if lines:
        terminalreporter.section("e2e measurements")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)
    if output is not None:  # a worker: the session shows them (pytest_testnodedown)
        output[_WORKER_OUTPUT] = list(measurements(session.config))
    factory = getattr(session.config, "_tmp_path_factory", None)
    basetemp = getattr(factory, "_basetemp", None)
    if basetemp is None or getattr(factory, "_given_basetemp", None) is not None:
        return
    with contextlib.suppress(OSError):  # not empty: a failed test's folders are kept
        basetemp.parent.rmdir()
