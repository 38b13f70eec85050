"""A control plane for people: ``up`` leaves it running in the background, ``down`` ends it.

``up`` builds the binaries if needed (in the foreground, with progress), then starts a detached
supervisor, ``python -m gangcheck_dev.testbed serve``, that owns a :class:`ControlPlane` and stops
it on SIGTERM. ``up --stack full`` adds kube-scheduler, kube-controller-manager, kwok, Kueue and
cluster-autoscaler (node groups from ``--node-groups FILE``, YAML or JSON, else the defaults of
:mod:`gangcheck_dev.testbed.nodes`); ``up --stack karpenter`` the same with Karpenter in
cluster-autoscaler's place. The state folder holds::

    serve.pid    the supervisor's pid (written first)
    serve.log    the supervisor's output
    state.json   written once the control plane is ready (kubeconfig, server, pids ...)
    error.txt    written instead if it failed to start
    cluster/     the control plane's own folder (certificates, etcd data, kubeconfig, logs)

``down`` stops what the demo runs on the stack (``gangcheck_dev.demo``: its record and what
names the folder), sends SIGTERM to the supervisor, waits, kills whatever is left of the
recorded processes and removes the state folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from gangcheck_dev.testbed.binaries import ensure_binaries
from gangcheck_dev.testbed.karpenter import NodePool
from gangcheck_dev.testbed.launcher import ControlPlane
from gangcheck_dev.testbed.nodes import GPU_RESOURCE, NodeGroup, Taint, load_node_groups
from gangcheck_dev.testbed.process import kill_group, log_tail, pid_alive, pid_cmdline
from gangcheck_dev.testbed.stack import FULL_STACK, MetricsCert

STATE_FILE = "state.json"
PID_FILE = "serve.pid"
ERROR_FILE = "error.txt"
LOG_FILE = "serve.log"
SERVE_MODULE = "gangcheck_dev.testbed"
START_TIMEOUT = 300.0
STOP_TIMEOUT = 60.0
#: ``--stack`` choices: the optional components each starts.
STACKS: dict[str, tuple[str, ...]] = {"minimal": (), "full": FULL_STACK, "karpenter": FULL_STACK}
#: Stacks whose autoscaler is Karpenter with its kwok cloud provider, in cluster-autoscaler's
#: place, with one NodePool ``gpu`` of the default 8-GPU instance type, tainted as GPU nodes are.
KARPENTER_STACKS = frozenset({"karpenter"})
KARPENTER_POOLS = (NodePool("gpu", taints=(Taint(GPU_RESOURCE, "present", "NoSchedule"),)),)


class DevError(RuntimeError):
    """The background control plane could not be started."""


@dataclass(frozen=True)
class DevInfo:
    state_dir: Path
    kubeconfig: Path
    server: str
    kubectl: Path
    pid: int
    components: tuple[str, ...] = ()

    @classmethod
    def from_state(cls, state_dir: Path, state: dict[str, Any]) -> DevInfo:
        return cls(
            state_dir=state_dir,
            kubeconfig=Path(state["kubeconfig"]),
            server=state["server"],
            kubectl=Path(state["kubectl"]),
            pid=int(state["pid"]),
            components=tuple(state.get("components", {})),
        )


def default_state_dir() -> Path:
    explicit = os.environ.get("GANGCHECK_STATE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "gangcheck" / "dev"


def _read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state


def _read_pid(state_dir: Path) -> int | None:
    try:
        return int((state_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _is_supervisor(pid: int) -> bool:
    argv = pid_cmdline(pid)
    return pid_alive(pid) and (not argv or (SERVE_MODULE in argv and "serve" in argv))


def _write_atomic(path: Path, text: str) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    partial.replace(path)


# -- up -------------------------------------------------------------------------------------


def _announce(info: DevInfo, out: TextIO, running: str) -> None:
    print(
        f"gangcheck: control plane {running} at {info.server} (supervisor pid {info.pid})", file=out
    )
    print(f"kubeconfig: {info.kubeconfig}", file=out)
    print(f"kubectl:    {info.kubectl}", file=out)
    print(f"components: {', '.join(info.components)}", file=out)
    print(f"export KUBECONFIG={info.kubeconfig}", file=out)


def read_node_groups(path: Path) -> list[NodeGroup]:
    """Node groups from a YAML/JSON file: a list of ``{name, max, cpu, memory, gpus, labels,
    taints ...}`` or ``{nodeGroups: [...]}`` (see :meth:`NodeGroup.from_dict`)."""
    try:
        return load_node_groups(yaml.safe_load(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as exc:
        raise DevError(f"cannot read node groups from {path}: {exc}") from exc


def _plane(root: Path, stack: str, node_groups_file: Path | None) -> ControlPlane:
    if stack not in STACKS:
        raise DevError(f"unknown stack {stack!r}; choose from {', '.join(STACKS)}")
    groups = read_node_groups(node_groups_file) if node_groups_file else None
    if stack in KARPENTER_STACKS:
        if groups is not None:
            raise DevError("--node-groups are cluster-autoscaler's; the karpenter stack has none")
        return ControlPlane(
            root=root, components=STACKS[stack], autoscaler="karpenter", node_pools=KARPENTER_POOLS
        )
    return ControlPlane(root=root, components=STACKS[stack], node_groups=groups)


def _spawn_supervisor(state_dir: Path, stack: str, node_groups_file: Path | None) -> None:
    argv = [sys.executable, "-m", SERVE_MODULE, "serve", "--state-dir", str(state_dir)]
    argv += ["--stack", stack]
    if node_groups_file is not None:
        argv += ["--node-groups", str(node_groups_file.resolve())]
    with (state_dir / LOG_FILE).open("ab") as log:
        # The child forks once more and returns at once: the supervisor is nobody's child.
        code = subprocess.run(
            [*argv, "--detach"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            check=False,
        ).returncode
    if code != 0:
        raise DevError(f"the supervisor exited with code {code}:\n{log_tail(state_dir / LOG_FILE)}")


def _await_ready(state_dir: Path, timeout: float) -> DevInfo:
    deadline = time.monotonic() + timeout
    while True:
        state = _read_state(state_dir)
        if state is not None:
            return DevInfo.from_state(state_dir, state)
        if (state_dir / ERROR_FILE).exists():
            raise DevError((state_dir / ERROR_FILE).read_text())
        pid = _read_pid(state_dir)
        if pid is not None and not pid_alive(pid):
            raise DevError(f"the supervisor died:\n{log_tail(state_dir / LOG_FILE)}")
        if time.monotonic() > deadline:
            raise DevError(f"not ready after {timeout:.0f}s:\n{log_tail(state_dir / LOG_FILE)}")
        time.sleep(0.2)


def up(
    state_dir: Path | None = None,
    *,
    out: TextIO | None = None,
    timeout: float = START_TIMEOUT,
    stack: str = "minimal",
    node_groups_file: Path | None = None,
) -> DevInfo:
    """Starts a control plane that outlives this process (or reports the one running).

    ``stack``: ``minimal`` (etcd + kube-apiserver) or ``full`` (every component of
    :data:`gangcheck_dev.testbed.stack.FULL_STACK`); ``node_groups_file`` sets cluster-autoscaler's
    node groups for ``full``.
    """
    out = out or sys.stdout
    plane = _plane(Path("unused"), stack, node_groups_file)  # validates before anything starts
    state_dir = state_dir or default_state_dir()
    state = _read_state(state_dir)
    if state is not None and _is_supervisor(int(state["pid"])):
        info = DevInfo.from_state(state_dir, state)
        _announce(info, out, "already running")
        return info
    if state_dir.exists():
        _clear(state_dir)  # left over from a supervisor that is gone
    ensure_binaries(plane.families)
    state_dir.mkdir(parents=True)
    try:
        _spawn_supervisor(state_dir, stack, node_groups_file)
        info = _await_ready(state_dir, timeout)
    except BaseException:
        _clear(state_dir)
        raise
    _announce(info, out, "running")
    return info


# -- down -----------------------------------------------------------------------------------


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _stop_supervisor(pid: int, timeout: float) -> None:
    if not _is_supervisor(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not _wait_gone(pid, timeout):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait_gone(pid, 5.0)


def _kill_leftovers(state: dict[str, Any]) -> None:
    """Components whose supervisor could not stop them (it was SIGKILLed, say)."""
    for component in state.get("components", {}).values():
        pid, binary = component.get("pid"), component.get("binary")
        if pid and pid_alive(pid) and pid_cmdline(pid)[:1] == [binary]:
            kill_group(pid, signal.SIGKILL)
            _wait_gone(pid, 10.0)


def _stop_attached(state_dir: Path) -> None:
    """What `demo up` runs on this stack beside it (its gangcheck, its simulated cloud, by
    their record and by their command lines naming the folder), stopped before the stack:
    `dev down` takes the demo's stack down too (they share the state folder), and a
    simulated cloud outliving its API server retries for ever."""
    from gangcheck_dev import demo  # noqa: PLC0415 - the demo is built on this module

    demo.stop_recorded(state_dir)
    demo.stop_leftovers(state_dir)


def _clear(state_dir: Path) -> None:
    _stop_attached(state_dir)
    pid = _read_pid(state_dir)
    if pid is not None:
        _stop_supervisor(pid, STOP_TIMEOUT)
    state = _read_state(state_dir)
    if state is not None:
        _kill_leftovers(state)
    shutil.rmtree(state_dir, ignore_errors=True)
    # What a killed supervisor could not undo outside its folder (Kueue's metrics cert).
    MetricsCert().release(state_dir / "cluster")


def down(state_dir: Path | None = None, *, out: TextIO | None = None) -> bool:
    """Stops the background control plane and removes its state; False if none was there."""
    out = out or sys.stdout
    state_dir = state_dir or default_state_dir()
    if not state_dir.exists():
        _stop_attached(state_dir)  # a demo's process still naming the folder gone
        print(f"gangcheck: no control plane in {state_dir}", file=out)
        return False
    _clear(state_dir)
    if not os.environ.get("GANGCHECK_STATE") and state_dir == default_state_dir():
        with contextlib.suppress(OSError):  # `<state home>/gangcheck`, made by up, if empty
            state_dir.parent.rmdir()
    print(f"gangcheck: control plane stopped, {state_dir} removed", file=out)
    return True


# -- the supervisor -------------------------------------------------------------------------


def _detach() -> None:
    """Classic double fork: the parent returns to ``up`` at once, the child carries on."""
    if os.fork() > 0:
        os._exit(0)


def _watch(plane: ControlPlane, stopping: threading.Event) -> None:
    reported: set[str] = set()
    while not stopping.wait(2.0):
        for name, component in plane.components.items():
            if not component.running and name not in reported:
                reported.add(name)
                print(f"gangcheck: {name} exited; see {component.log_path}", flush=True)


class _Stopped(Exception):
    """A stop signal arrived while the control plane was still starting."""


def _on_signals(handler: Any) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, handler)


def _interrupt(*_: object) -> None:
    raise _Stopped


def serve(
    state_dir: Path,
    *,
    detach: bool = False,
    stack: str = "minimal",
    node_groups_file: Path | None = None,
) -> int:
    """Runs a control plane until SIGTERM, SIGINT or SIGHUP; records it in ``state_dir``."""
    if detach:
        _detach()
    (state_dir / PID_FILE).write_text(f"{os.getpid()}\n")
    _on_signals(_interrupt)  # start() cleans up after itself when interrupted
    try:
        plane = _plane(state_dir / "cluster", stack, node_groups_file)
        plane.start()
    except _Stopped:
        return 1
    except Exception as exc:
        _write_atomic(state_dir / ERROR_FILE, f"{type(exc).__name__}: {exc}\n")
        return 1
    stopping = threading.Event()
    _on_signals(lambda *_: stopping.set())
    try:
        state = {"pid": os.getpid(), **plane.describe()}
        _write_atomic(state_dir / STATE_FILE, json.dumps(state, indent=2))
        timings = ", ".join(f"{name} {sec:.1f}s" for name, sec in plane.timings.items())
        print(f"gangcheck: ready in {plane.startup_seconds:.1f}s at {plane.server}", flush=True)
        print(f"gangcheck: start phases: {timings}", flush=True)
        _watch(plane, stopping)
    finally:
        _on_signals(signal.SIG_IGN)
        plane.stop()
        print("gangcheck: stopped", flush=True)
    return 0
