"""Child processes of the test bed: start in their own process group, probe, stop, show logs.

A :class:`Component` is one long-running binary (etcd, kube-apiserver, later kube-scheduler,
kwok, Kueue ...): a name, an argv, a log file and a readiness probe.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

Probe = Callable[[], bool]
TAIL_LINES = 30


class ComponentError(RuntimeError):
    """A component failed to start or become ready; carries the tail of its log."""

    def __init__(self, component: str, problem: str, log_path: Path, tail: str) -> None:
        self.component = component
        self.problem = problem
        self.log_path = log_path
        self.tail = tail
        super().__init__(
            f"{component}: {problem}\n--- last {TAIL_LINES} lines of {log_path} ---\n{tail}"
        )


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ('' if it does not exist)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def _port_slot() -> tuple[int, int]:
    """This process's share of the port numbers: (index, of how many). A test session run by
    several workers (pytest-xdist sets ``PYTEST_XDIST_WORKER=gw<i>`` and the count) gives each
    worker the ports ``p % count == i``: a port one worker picked and released for a server to
    take is never handed to another worker's server meanwhile."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()):
        return 0, 1
    return int(worker[2:]) % max(int(count), 1), max(int(count), 1)


LOWEST_PORT = 10000
_handed_out: set[int] = set()


def _port_range() -> tuple[int, int]:
    """Where `free_ports` picks: from LOWEST_PORT up to the kernel's ephemeral range (where
    ``connect`` and ``bind(0)`` take theirs; 32768 where it cannot be read)."""
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    return LOWEST_PORT, max(ephemeral, LOWEST_PORT + 1000)


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1, from this process's share of the port
    numbers (`_port_slot`), below the kernel's ephemeral range: between the pick and the
    server's ``bind``, an outgoing connection of any process can take an ephemeral port (an
    etcd once died of "address already in use" so), never one of these. A port is handed out
    once per process, so two pickers before either binds never get the same one."""
    index, of = _port_slot()
    low, high = _port_range()
    candidates = [p for p in range(low, high) if p % of == index]
    chosen: list[int] = []
    for port in random.sample(candidates, len(candidates)):
        if port in _handed_out or not _bindable(port):
            continue
        _handed_out.add(port)
        chosen.append(port)
        if len(chosen) == count:
            return chosen
    raise OSError(f"no {count} free ports in share {index} of {of} in [{low}, {high})")


def _bindable(port: int) -> bool:
    """Whether nothing holds 127.0.0.1:port, not even a connection in TIME_WAIT."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def port_is_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:port now (as Go servers do: SO_REUSEADDR)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            return False
    return True


def pid_alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def pid_cmdline(pid: int) -> list[str]:
    """The argv of a live process ([] if unknown)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line mentions ``text`` (e.g. a control plane's folder):
    what tests read to say nothing of theirs is left running."""
    found = []
    for entry in Path("/proc").iterdir():
        pid = int(entry.name) if entry.name.isdigit() else 0
        if pid and pid_alive(pid) and any(text in arg for arg in pid_cmdline(pid)):
            found.append(pid)
    return found


def kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


@dataclass
class Component:
    """One binary of the test bed, run in its own session with its output in ``log_path``."""

    name: str
    argv: Sequence[str]
    log_path: Path
    probe: Probe
    env: Mapping[str, str] | None = None
    ready_timeout: float = 60.0
    stop_timeout: float = 15.0
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def tail(self, lines: int = TAIL_LINES) -> str:
        return log_tail(self.log_path, lines)

    def error(self, problem: str) -> ComponentError:
        return ComponentError(self.name, problem, self.log_path, self.tail())

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ if self.env is None else self.env)
        with self.log_path.open("ab") as log:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            log.write(f"=== {stamp} gangcheck starts: {' '.join(self.argv)}\n".encode())
            log.flush()
            try:
                self._process = subprocess.Popen(
                    list(self.argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                raise self.error(f"cannot run {self.argv[0]}: {exc}") from exc

    def wait_ready(self) -> None:
        """Polls the probe until it passes; raises if the process exits or time runs out."""
        deadline = time.monotonic() + self.ready_timeout
        delay = 0.05
        while True:
            if self._process is None:
                raise RuntimeError(f"{self.name} was not started")
            code = self._process.poll()
            if code is not None:
                raise self.error(f"exited with code {code} before becoming ready")
            if self.probe():
                return
            if time.monotonic() > deadline:
                raise self.error(f"not ready after {self.ready_timeout:.0f}s")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after ``stop_timeout``; waits for the exit."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            kill_group(process.pid, signal.SIGTERM)
            try:
                process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                kill_group(process.pid, signal.SIGKILL)
                process.wait()
        # Anything else that joined the group (none of our binaries fork) goes too.
        kill_group(process.pid, signal.SIGKILL)
