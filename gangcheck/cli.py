"""Command line: argument parsing only; the work lives in the modules it calls."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import signal
import socket
import sys
from collections.abc import Coroutine, Sequence
from typing import Any


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gangcheck",
        description="All-or-nothing provisioning for GPU gangs (a Kueue AdmissionCheck).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the controller")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or in-cluster)")
    run.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    run.add_argument("--workers", type=int, default=4, help="concurrent reconciles (default 4)")
    run.add_argument("--log-level", default="INFO")
    run.add_argument("--leader-elect", action="store_true", help="reconcile only while leader")
    run.add_argument("--lease-namespace", default="gangcheck-system")
    run.add_argument("--lease-name", default="gangcheck")
    run.add_argument("--identity", help="this replica on the lease (default: hostname + random)")
    run.add_argument("--lease-duration", type=float, default=15.0, help="seconds (default 15)")
    run.add_argument("--renew-deadline", type=float, default=10.0, help="seconds (default 10)")
    run.add_argument("--retry-period", type=float, default=2.0, help="seconds (default 2)")
    run.add_argument("--health-port", type=int, default=8081, help="/healthz and /readyz")
    run.add_argument("--metrics-port", type=int, default=8080, help="/metrics")
    run.add_argument("--bind-address", default="0.0.0.0")
    dev = sub.add_parser("dev", help="a local control plane for trying gangcheck")
    dev.add_argument("action", choices=["up", "down"])
    dev.add_argument("--state-dir", help="where the local control plane keeps its files")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "dev":
        return _dev(args)
    return 2  # pragma: no cover - argparse rejects unknown commands


def _run(args: argparse.Namespace) -> int:
    from gangcheck.app import RunOptions, run_controller
    from gangcheck.kube.client import Kube
    from gangcheck.runtime.leader import LeaseConfig
    from gangcheck.telemetry import setup_logging

    setup_logging(args.log_level)

    lease = (
        LeaseConfig(
            args.lease_namespace,
            args.lease_name,
            identity=args.identity or _identity(),
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
        )
        if args.leader_elect
        else None
    )
    options = RunOptions(
        workers=args.workers,
        leader_election=lease,
        bind_address=args.bind_address,
        health_port=args.health_port,
        metrics_port=args.metrics_port,
    )

    async def go() -> None:
        kube = await Kube.connect(args.kubeconfig, in_cluster=args.in_cluster)
        async with kube:
            await _until_terminated(run_controller(kube, options))

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(go())
    return 0


def _identity() -> str:
    """A replica's identity on the lease: its pod name (hostname) and a random suffix."""
    return f"{socket.gethostname()}-{secrets.token_hex(4)}"


async def _until_terminated(work: Coroutine[Any, Any, None]) -> None:
    """Run until done or SIGTERM/SIGINT; on a signal, cancel (the lease is released)."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _dev(args: argparse.Namespace) -> int:
    from gangcheck.testbed import dev

    if args.action == "up":
        dev.up(args.state_dir)
    else:
        dev.down(args.state_dir)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
