"""Command line: argument parsing only; the work lives in the modules it calls."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Sequence


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
    from gangcheck.app import run_controller
    from gangcheck.kube.client import Kube
    from gangcheck.telemetry import setup_logging

    setup_logging(args.log_level)

    async def go() -> None:
        kube = await Kube.connect(args.kubeconfig, in_cluster=args.in_cluster)
        async with kube:
            await run_controller(kube, workers=args.workers)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(go())
    return 0


def _dev(args: argparse.Namespace) -> int:
    from gangcheck.testbed import dev

    if args.action == "up":
        dev.up(args.state_dir)
    else:
        dev.down(args.state_dir)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
