"""`make demo` as the README's first command: the gangs start, the gangcheck that ran them
stays up to explore (its metrics, with the demo's rollback, where the hints say), and
`make demo-down` leaves nothing."""

from __future__ import annotations

import io
import json
import re
import urllib.request
from pathlib import Path

import pytest
from gangcheck_dev import demo
from gangcheck_dev.testbed import dev
from gangcheck_dev.testbed.process import pid_alive, pid_cmdline, port_is_free
from gangcheck_dev.testbed.stack import KUEUE_METRICS_CERT_DIR, MetricsCert

from gangcheck.cli import _parser, _settings

pytestmark = pytest.mark.integration


def test_the_controller_left_running_takes_its_arguments() -> None:
    """`gangcheck run` refuses port 0: the one left running gets real ports."""
    args = demo.explore_run_args(Path("k"), 41001, 41002, ["--webhook-port", "41003"])
    settings = _settings(_parser().parse_args(args))
    assert (settings.server.health_port, settings.server.metrics_port) == (41001, 41002)


def test_the_hints_say_where_the_metrics_are() -> None:
    hints = demo.explore_hints(Path("/state/kubeconfig"), Path("/cache/kubectl"), 41002)
    assert "curl -s http://127.0.0.1:41002/metrics" in hints and "docs/metrics.md" in hints


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        pid = int(entry.name) if entry.name.isdigit() else 0
        if pid and pid_alive(pid) and any(text in arg for arg in pid_cmdline(pid)):
            found.append(pid)
    return found


@pytest.mark.timeout(400)  # the stack (seconds once built), the three gangs (about a minute)
def test_demo_up_leaves_gangcheck_running_and_down_leaves_nothing(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    out = io.StringIO()
    try:
        assert demo.up(state_dir, out=out) == 0, out.getvalue()
        said = out.getvalue()
        assert "provisioning requests left: 3" in said
        state = json.loads((state_dir / dev.STATE_FILE).read_text())
        pids = [state["pid"], *(c["pid"] for c in state["components"].values())]
        left = json.loads((state_dir / demo.PROCESSES_FILE).read_text())
        assert all(pid_alive(pid) for pid in [*pids, *left]), said
        (port,) = re.findall(r"curl -s http://127\.0\.0\.1:(\d+)/metrics", said)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            metrics = reply.read().decode()
        # the controller left running is the one that ran the gangs: its metrics count the
        # partial delivery's rollback and the nodes it reclaimed (docs/metrics.md)
        counted = dict(
            line.rsplit(" ", 1) for line in metrics.splitlines() if not line.startswith("#")
        )
        assert float(counted['gangcheck_rollbacks_total{reason="Deadline"}']) >= 1, metrics
        assert float(counted["gangcheck_nodes_reclaimed_total"]) >= 1, metrics
        assert float(counted['gangcheck_attempts_total{outcome="ready"}']) >= 2, metrics
    finally:
        demo.down(state_dir, out=io.StringIO())
    assert not any(pid_alive(pid) for pid in [*pids, *left])
    assert port_is_free(int(port))
    assert not state_dir.exists()
    assert _processes_mentioning(str(state_dir)) == []
    owners = KUEUE_METRICS_CERT_DIR / MetricsCert.OWNERS
    if owners.exists():  # another stack on this machine may still hold the certificate
        assert str(state_dir) not in owners.read_text()
