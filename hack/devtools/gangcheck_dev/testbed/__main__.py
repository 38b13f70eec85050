"""``python -m gangcheck_dev.testbed up|down``: a local control plane for people.

``up`` starts etcd + kube-apiserver; ``up --stack full`` the whole cluster (kube-scheduler,
kube-controller-manager, kwok, Kueue, cluster-autoscaler), with ``--node-groups FILE`` for
cluster-autoscaler's node groups; ``up --stack karpenter`` the same with Karpenter (its kwok
cloud provider) in cluster-autoscaler's place. ``serve`` is internal: the detached
supervisor ``up`` starts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from gangcheck_dev.testbed import dev
from gangcheck_dev.testbed.binaries import BuildError


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Local Kubernetes control plane on 127.0.0.1: etcd + kube-apiserver, or "
        "with --stack full the whole cluster (scheduler, controller manager, kwok, Kueue, "
        "cluster-autoscaler), or with --stack karpenter the same with Karpenter in "
        "cluster-autoscaler's place.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("up", "start it in the background (builds the binaries on first use)"),
        ("down", "stop it and remove its state"),
        ("serve", argparse.SUPPRESS),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument(
            "--state-dir",
            type=Path,
            default=None,
            help="default: $GANGCHECK_STATE or ~/.local/state/gangcheck/dev",
        )
        if name in ("up", "serve"):
            command.add_argument(
                "--stack",
                choices=sorted(dev.STACKS),
                default="minimal",
                help="minimal: etcd + kube-apiserver (default); full: every component; "
                "karpenter: every component, Karpenter in cluster-autoscaler's place",
            )
            command.add_argument(
                "--node-groups",
                type=Path,
                default=None,
                metavar="FILE",
                help="cluster-autoscaler node groups (YAML/JSON list of {name, max, cpu, memory, "
                "gpus, labels, taints}) for --stack full",
            )
        if name == "serve":
            command.add_argument("--detach", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m gangcheck_dev.testbed") -> int:
    args = _parser(prog).parse_args(argv)
    state_dir: Path = args.state_dir or dev.default_state_dir()
    if args.command == "serve":
        return dev.serve(
            state_dir, detach=args.detach, stack=args.stack, node_groups_file=args.node_groups
        )
    if args.command == "down":
        dev.down(state_dir)
        return 0
    try:
        dev.up(state_dir, stack=args.stack, node_groups_file=args.node_groups)
    except (dev.DevError, BuildError) as exc:
        print(f"gangcheck: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
