"""Session-wide: a green run leaves no temp folder behind.

pytest removes a green session's temp folders itself (``tmp_path_retention_policy`` in
pyproject.toml) but keeps the per-user folder it makes them in; that one goes too once empty.
"""

from __future__ import annotations

import contextlib

import pytest


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    factory = getattr(session.config, "_tmp_path_factory", None)
    basetemp = getattr(factory, "_basetemp", None)
    if basetemp is None or getattr(factory, "_given_basetemp", None) is not None:
        return
    with contextlib.suppress(OSError):  # not empty: a failed test's folders are kept
        basetemp.parent.rmdir()
