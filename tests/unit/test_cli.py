"""The command line's own answers (no cluster): what ``gangcheck --version`` prints."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from gangcheck.cli import main


def test_version_flag_prints_the_installed_distributions_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"gangcheck {version('gangcheck')}"
