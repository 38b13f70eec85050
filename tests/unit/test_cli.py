"""The command line's own answers (no cluster): ``--version``, the help, and bad input.

Every command answers bad input (a missing kubeconfig, a server that does not answer, a flag
value it refuses) with one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from gangcheck import cli
from gangcheck.cli import main


def test_version_flag_prints_the_installed_distributions_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"gangcheck {version('gangcheck')}"


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_every_run_flag_has_help_text(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys, "run")
    assert "--leader-elect reconcile only while this replica holds the leader Lease" in text
    assert "--log-level LOG_LEVEL DEBUG, INFO, WARNING, ERROR or CRITICAL" in text


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """``gangcheck run`` sets up the root logger; leave it as it was for the other tests."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


@pytest.fixture
def unreachable_kubeconfig(tmp_path: Path) -> str:
    """A kubeconfig whose server is a port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _one_line_failure(
    capsys: pytest.CaptureFixture[str], argv: list[str], code: int, says: str
) -> None:
    try:
        got = main(argv)
    except SystemExit as exited:  # argparse's refusals exit
        got = exited.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert got == code, err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    assert says in err


COMMANDS = {
    "run": ["run"],
    "status": ["status"],
    "diagnose": ["diagnose", "job/default/train"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_kubeconfig_is_one_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "missing")
    argv = [*COMMANDS[command], "--kubeconfig", missing]
    _one_line_failure(capsys, argv, 1, f"gangcheck: kubeconfig {missing} not found")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_kubeconfig_that_is_no_kubeconfig_is_one_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\n")
    argv = [*COMMANDS[command], "--kubeconfig", str(path)]
    _one_line_failure(capsys, argv, 1, "cannot load the kubeconfig")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", COMMANDS)
def test_an_unreachable_server_is_one_line(
    command: str,
    unreachable_kubeconfig: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(cli, "REACH_SECONDS", 0.0)  # run: one round of retries, not 30 s
    argv = [*COMMANDS[command], "--kubeconfig", unreachable_kubeconfig]
    _one_line_failure(capsys, argv, 1, "gangcheck: cannot reach the API server")


@pytest.mark.parametrize("command", COMMANDS)
def test_in_cluster_outside_a_cluster_is_one_line(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every command takes --in-cluster (diagnose and status from within gangcheck's pod)."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    argv = [*COMMANDS[command][:1], "--in-cluster", *COMMANDS[command][1:]]
    _one_line_failure(capsys, argv, 1, "gangcheck: cannot use the in-cluster configuration")


@pytest.mark.parametrize("command", COMMANDS)
def test_no_kubeconfig_anywhere_is_one_line_naming_flags_the_command_takes(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    _one_line_failure(capsys, COMMANDS[command], 1, "no kubeconfig at ~/.kube/config")
    assert not [r for r in caplog.records if r.name.startswith("kubernetes_asyncio")]
    for flag in ("--kubeconfig", "--in-cluster"):
        assert flag in _help(capsys, *COMMANDS[command][:1])


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["run", "--workers", "many"], "gangcheck run: argument --workers: invalid int value"),
        (["run", "--log-level", "LOUD"], "--log-level: must be 'DEBUG', 'INFO', 'WARNING'"),
        (["run", "--workers", "0"], "--workers: must be greater than or equal to 1"),
        (["run", "--health-port", "70000"], "--health-port: must be less than or equal to 65535"),
        (["run", "--bind-address", "localhost"], "--bind-address: must be an IP address"),
        (["run", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["status", "-o", "xml"], "gangcheck status: argument -o/--output: invalid choice"),
        (["status", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["diagnose", "-o", "xml", "job/a/b"], "gangcheck diagnose: argument -o/--output"),
        (["diagnose"], "the following arguments are required: TARGET"),
        (["diagnose", "train"], "gangcheck: "),
        (["launch"], "gangcheck: argument command: invalid choice: 'launch'"),
        ([], "gangcheck: the following arguments are required: command"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else "",
)
def test_a_flag_value_refused_is_one_line(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = 1 if argv[:1] == ["diagnose"] and len(argv) == 2 else 2
    _one_line_failure(capsys, argv, code, says)
