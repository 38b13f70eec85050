"""``gangcheck-dev demo|dev|sim-cloud``: the demo, a local control plane, the simulated cloud."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

#: What ``gangcheck-dev demo up`` (and ``make demo``) does, said the same everywhere.
DEMO = (
    "the local full stack and gangcheck, then three GPU gangs: two Kueue Jobs (one partly "
    "delivered, rolled back and retried) and a PodGroup; stays up"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gangcheck-dev", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("sim-cloud", help="a simulated cloud for tests and demos", add_help=False)
    demo = sub.add_parser("demo", help=f"up: {DEMO}; down: remove it")
    demo.add_argument("action", choices=["up", "down"])
    demo.add_argument("--state-dir", type=Path, help="where the demo keeps its files")
    sub.add_parser(
        "dev",
        help="a local control plane for trying gangcheck: up [--stack minimal|full|karpenter] "
        "[--node-groups FILE], down (gangcheck-dev dev --help)",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sim-cloud":
        from gangcheck_dev.simcloud import main as sim_main

        return sim_main(argv[1:])
    if argv and argv[0] == "dev":  # the test bed's own command line: up/down and their flags
        from gangcheck_dev.testbed.__main__ import main as dev_main

        return dev_main(argv[1:], prog="gangcheck-dev dev")
    args = _parser().parse_args(argv)
    from gangcheck_dev import demo

    if args.action == "down":
        return demo.down(args.state_dir)
    try:
        return demo.up(args.state_dir)
    except KeyboardInterrupt:
        print(
            "\ngangcheck-dev: demo interrupted; remove what it started with: make demo-down",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
