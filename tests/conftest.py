"""Session-wide: the soak split, and a green run leaves no temp folder behind.

Tests marked ``soak`` (the long scenarios: more seeds, long waits, comparisons) run in
``make soak`` (``GANGCHECK_SOAK=1``) and only there; every other test runs in ``make test``
and only there. docs/testing.md lists what runs where and why.

pytest removes a green session's temp folders itself (``tmp_path_retention_policy`` in
pyproject.toml) but keeps the per-user folder it makes them in; that one goes too once empty.
"""

from __future__ import annotations

import contextlib
import os

import pytest

SOAK_ENV = "GANGCHECK_SOAK"


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


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    factory = getattr(session.config, "_tmp_path_factory", None)
    basetemp = getattr(factory, "_basetemp", None)
    if basetemp is None or getattr(factory, "_given_basetemp", None) is not None:
        return
    with contextlib.suppress(OSError):  # not empty: a failed test's folders are kept
        basetemp.parent.rmdir()
