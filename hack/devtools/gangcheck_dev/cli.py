"""``gangcheck-dev demo|dev|sim-cloud``: the demo, a local control plane, the simulated cloud."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gangcheck-dev", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("sim-cloud", help="a simulated cloud for tests and demos", add_help=False)
    demo = sub.add_parser("demo", help="the local full stack, gangcheck and two GPU gangs")
    demo.add_argument("action", choices=["up", "down"])
    demo.add_argument("--state-dir", type=Path, help="where the demo keeps its files")
    dev = sub.add_parser("dev", help="a local control plane for trying gangcheck")
    dev.add_argument("action", choices=["up", "down"])
    dev.add_argument("--state-dir", type=Path, help="where the local control plane keeps its files")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sim-cloud":
        from gangcheck_dev.simcloud import main as sim_main

        return sim_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from gangcheck_dev import demo

        return demo.up(args.state_dir) if args.action == "up" else demo.down(args.state_dir)
    from gangcheck_dev.testbed import dev as local

    if args.action == "up":
        local.up(args.state_dir)
    else:
        local.down(args.state_dir)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
