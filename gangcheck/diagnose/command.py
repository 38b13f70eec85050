"""The entry points `gangcheck diagnose` and `gangcheck status`: arguments, output, exit code."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from gangcheck.cli import ArgumentParser
from gangcheck.diagnose.as_json import to_json
from gangcheck.diagnose.fetch import controller_down, diagnose, status, target_of
from gangcheck.diagnose.reports import DiagnoseError, Report, StatusReport
from gangcheck.diagnose.text import render_text
from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError
from gangcheck.settings import LEASE_NAME, LEASE_NAMESPACE

R = TypeVar("R")


def main_diagnose(argv: Sequence[str] | None = None) -> int:
    parser = _parser("diagnose", "Say what blocks a gang, walking quota -> check -> nodes.")
    parser.add_argument(
        "target",
        metavar="TARGET",
        help="KIND/NAMESPACE/NAME; KIND is job, workload, pod or podgroup (the upstream "
        "PodGroup, else the scheduler-plugins one; podgroup.scheduling.x-k8s.io for that one)",
    )
    args = parser.parse_args(argv)
    try:
        target_of(args.target)  # a malformed target fails before any connection
    except DiagnoseError as e:
        return _fail(str(e))
    return _main(args, lambda kube: diagnose(kube, args.target))


def main_status(argv: Sequence[str] | None = None) -> int:
    parser = _parser("status", "List the gangs in flight and where each one stands.")
    parser.add_argument("-n", "--namespace", help="only this namespace (default: all)")
    args = parser.parse_args(argv)
    return _main(args, lambda kube: status(kube, args.namespace))


def _parser(command: str, description: str) -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=f"gangcheck {command}", description=description)
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG)")
    parser.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
    parser.add_argument(
        "--lease",
        metavar="NAMESPACE/NAME",
        default=f"{LEASE_NAMESPACE}/{LEASE_NAME}",
        help="gangcheck's leader Lease, read to say when no gangcheck acts here "
        "(default: %(default)s; gangcheck's leaderElection.namespace/name)",
    )
    return parser


def _main(
    args: argparse.Namespace,
    work: Callable[[Kube], Awaitable[Report | StatusReport]],
) -> int:
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        return _fail(f"kubeconfig {args.kubeconfig} not found")
    namespace, _, name = str(args.lease).partition("/")
    if not namespace or not name or "/" in name:
        return _fail(f"--lease {args.lease!r}: expected NAMESPACE/NAME")

    async def told(kube: Kube) -> Report | StatusReport:
        report = await work(kube)
        down = await controller_down(kube, report.now, (namespace, name))
        return replace(report, controller=down) if down else report

    try:
        report = asyncio.run(_with_kube(args.kubeconfig, args.in_cluster, told))
    except DiagnoseError as e:
        return _fail(str(e))
    except ApiError as e:
        if e.status == 0:
            return _fail(f"cannot reach the API server: {e.message}")
        return _fail(f"the API server answered {e.status} {e.reason}: {e.message}")
    if args.output == "json":
        print(json.dumps(to_json(report), indent=2))
    else:
        print(render_text(report), end="")
    return 0


async def _with_kube(
    kubeconfig: str | None, in_cluster: bool, work: Callable[[Kube], Awaitable[R]]
) -> R:
    try:
        kube = await Kube.connect(kubeconfig, in_cluster=in_cluster)
    except Exception as e:  # the client's config errors are its own types; one line suffices
        said = "" if in_cluster else "cannot load the kubeconfig: "
        raise DiagnoseError(f"{said}{e}") from e
    async with kube:
        return await work(kube)


def _fail(message: str) -> int:
    print(f"gangcheck: {message.splitlines()[0] if message else 'failed'}", file=sys.stderr)
    return 1
