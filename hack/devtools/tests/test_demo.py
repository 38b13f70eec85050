"""`make demo` as the README's first command: the gangs start, the gangcheck that ran them
stays up to explore (its metrics, with the demo's rollback, where the hints say), and
`make demo-down` leaves nothing."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from gangcheck_dev import demo
from gangcheck_dev.testbed import dev
from gangcheck_dev.testbed.process import (
    free_ports,
    pid_alive,
    pid_cmdline,
    port_is_free,
    processes_mentioning,
)
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


def _unreachable_kubeconfig(folder: Path) -> Path:
    """A kubeconfig naming an API server nobody serves: the process on it runs, retrying."""
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return kubeconfig


def test_what_demo_up_left_running_is_stopped_and_nothing_else(tmp_path: Path) -> None:
    """`demo up` again, or `demo down`, stops the processes the last `demo up` recorded; a
    recorded pid that is no longer such a process (reused) is left alone."""
    kubeconfig = _unreachable_kubeconfig(tmp_path)
    health, metrics = free_ports(2)
    args = demo.explore_run_args(kubeconfig, health, metrics, [])
    controller = demo._detached("gangcheck", args, tmp_path / "gangcheck.log")  # retries 30 s
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (tmp_path / demo.PROCESSES_FILE).write_text(json.dumps([controller, other.pid]))
        demo.stop_recorded(tmp_path, timeout=10)
        assert not pid_alive(controller)
        assert other.poll() is None
        assert not (tmp_path / demo.PROCESSES_FILE).exists()
    finally:
        other.kill()
        other.wait()
        os.waitpid(controller, 0)


def test_down_stops_a_demo_process_its_record_missed(tmp_path: Path) -> None:
    """A simulated cloud of the demo's on this state folder that no record names (a `demo up`
    interrupted before it wrote it), and one leading no process group of its own, are
    stopped; a process of another command naming the folder is left alone."""
    kubeconfig = _unreachable_kubeconfig(tmp_path)
    args = ["sim-cloud", "--kubeconfig", str(kubeconfig), "--config-map", "demo/sim-cloud"]
    unrecorded = demo._detached("gangcheck_dev", args, tmp_path / "sim.log")
    groupless = subprocess.Popen(  # in this process's group: no group of its own to signal
        [sys.executable, "-m", "gangcheck_dev", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    other = subprocess.Popen(["sh", "-c", "sleep 60", str(tmp_path)], start_new_session=True)
    try:
        (tmp_path / demo.PROCESSES_FILE).write_text(json.dumps([groupless.pid]))
        demo.stop_recorded(tmp_path, timeout=10)
        assert groupless.wait(10) is not None
        assert pid_alive(unrecorded)
        assert demo.stop_leftovers(tmp_path, timeout=10) == [unrecorded]
        assert not pid_alive(unrecorded)
        assert other.poll() is None
    finally:
        for process in (groupless, other):
            process.kill()
            process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(unrecorded, signal.SIGKILL)
        os.waitpid(unrecorded, 0)


def test_dev_down_stops_what_demo_up_left_on_its_stack(tmp_path: Path) -> None:
    """`make dev-down` takes down the demo's stack too (they share the state folder): before,
    it stopped the stack and left the demo's simulated cloud running, retrying for ever
    against an API server gone (seen after `make demo`, `make dev-down`). Now it stops what
    `demo up` recorded and what names the folder, as `demo down` does."""
    state = tmp_path / "state"
    state.mkdir()
    kubeconfig = _unreachable_kubeconfig(state)
    args = ["sim-cloud", "--kubeconfig", str(kubeconfig), "--config-map", "demo/sim-cloud"]
    recorded = demo._detached("gangcheck_dev", args, tmp_path / "sim.log")
    unrecorded = demo._detached("gangcheck_dev", args, tmp_path / "sim-2.log")
    try:
        (state / demo.PROCESSES_FILE).write_text(json.dumps([recorded]))
        assert dev.down(state, out=io.StringIO())
        assert not pid_alive(recorded)
        assert not pid_alive(unrecorded)
        assert not state.exists()
    finally:
        for pid in (recorded, unrecorded):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


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
        first = json.loads((state_dir / demo.PROCESSES_FILE).read_text())
        assert all(pid_alive(pid) for pid in [*pids, *first]), said
        # a process is its pid and its start: pids wrap (pid_max may be 32768) while other
        # tests start processes of the same command line side by side
        started = {pid: _started(pid) for pid in [*pids, *first]}
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

        # `make demo` again while it is up: what the first left running makes way
        out = io.StringIO()
        assert demo.up(state_dir, out=out) == 0, out.getvalue()
        assert "control plane already running" in out.getvalue()
        assert not any(pid_alive(pid) for pid in first)
        left = json.loads((state_dir / demo.PROCESSES_FILE).read_text())
        assert all(pid_alive(pid) for pid in left), out.getvalue()
        started.update({pid: _started(pid) for pid in left})
    finally:
        demo.down(state_dir, out=io.StringIO())
    alive = {
        pid: pid_cmdline(pid)
        for pid in [*pids, *first, *left]
        if pid_alive(pid) and _started(pid) == started[pid]
    }
    assert not alive, f"left running after down: {alive}"
    assert port_is_free(int(port))
    assert not state_dir.exists()
    assert processes_mentioning(str(state_dir)) == []
    owners = KUEUE_METRICS_CERT_DIR / MetricsCert.OWNERS
    if owners.exists():  # another stack on this machine may still hold the certificate
        assert str(state_dir) not in owners.read_text()


def _started(pid: int) -> str | None:
    """When the process `pid` started (its start time in clock ticks since boot, from
    /proc/PID/stat), or None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def test_down_naming_its_state_folder_does_not_stop_itself(tmp_path: Path) -> None:
    """`demo down --state-dir <folder>` names the folder on its own command line, as a
    `python -m gangcheck_dev` process: before, its sweep of processes the record missed
    found itself and sent itself SIGTERM, ending before the stack was taken down."""
    state = tmp_path / "state"
    state.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "gangcheck_dev", "demo", "down", "--state-dir", str(state)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,  # should it signal its group, only its own
    )
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert not state.exists()


def test_a_process_of_another_folder_the_name_begins_is_not_the_demos() -> None:
    folder = "/x/demo"
    assert demo._names_folder(["python", "--kubeconfig", "/x/demo/kubeconfig"], folder)
    assert demo._names_folder(["python", "--kubeconfig=/x/demo/kubeconfig"], folder)
    assert demo._names_folder(["python", "--state-dir", "/x/demo"], folder)
    assert not demo._names_folder(["python", "--kubeconfig", "/x/demo2/kubeconfig"], folder)
    assert not demo._names_folder(["python", "--state-dir=/x/demo2"], folder)
