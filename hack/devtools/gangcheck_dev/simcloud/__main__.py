"""``python -m gangcheck_dev.simcloud --kubeconfig K --config-map NS/NAME``: run the simulated cloud
until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import sys
from collections.abc import Sequence

from gangcheck.kube.client import Kube
from gangcheck.telemetry import setup_logging
from gangcheck_dev.simcloud.cloud import SimCloud


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(
        prog="gangcheck-dev sim-cloud",
        description="A simulated cloud answering ProvisioningRequests with real Nodes.",
    )
    cli.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or in-cluster)")
    cli.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    cli.add_argument(
        "--config-map",
        required=True,
        metavar="NS/NAME",
        help="the ConfigMap whose key 'config' holds the behaviour (YAML or JSON)",
    )
    cli.add_argument("--seed", type=int, help="seed for node names (default: random)")
    cli.add_argument("--log-level", default="INFO")
    return cli


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    setup_logging(args.log_level)
    asyncio.run(serve(args))
    return 0


async def serve(args: argparse.Namespace) -> None:
    """Run the sim until a termination signal; then stop it cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with await Kube.connect(args.kubeconfig, in_cluster=args.in_cluster) as kube:
        sim = SimCloud(kube, args.config_map, rng=random.Random(args.seed))
        running = asyncio.create_task(sim.run())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        for task in (running, stopping):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


if __name__ == "__main__":
    sys.exit(main())
