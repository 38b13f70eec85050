"""Command line: argument parsing only; the work lives in the modules it calls."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import socket
import sys
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from gangcheck.kube.client import Kube
    from gangcheck.kube.errors import ApiError

#: How long ``gangcheck run`` waits at start for the API server to answer before it gives up.
REACH_SECONDS = 30.0
#: The leader Lease of ``--role dispatcher`` unless ``--lease-name`` (or the settings) names one.
DISPATCHER_LEASE = "gangcheck-dispatcher"


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a command line it refuses is one line on stderr (exit 2), not the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="gangcheck",
        description="All-or-nothing provisioning for GPU gangs (a Kueue AdmissionCheck).",
    )
    parser.add_argument("--version", action="version", version=f"gangcheck {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the controller")
    run.add_argument("--config", help="settings file (see config/gangcheck.yaml)")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or in-cluster)")
    run.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    run.add_argument(
        "--role",
        choices=("controller", "dispatcher"),
        default="controller",
        help="controller: the provisioning check (in each cluster that runs gangs); "
        "dispatcher: the capacity-aware MultiKueue dispatcher, in the manager cluster "
        "(docs/multicluster.md)",
    )
    run.add_argument(
        "--dispatch-at-once",
        type=int,
        default=1,
        help="dispatcher: how many worker clusters may try one gang at the same time",
    )
    # Each flag below overrides its settings field (file, then GANGCHECK_<SECTION>__<FIELD>).
    for flag, kind, text in _RUN_FLAGS:
        run.add_argument(flag, type=kind, default=None, help=text)
    run.add_argument(
        "--leader-elect",
        action="store_const",
        const=True,
        default=None,
        help="reconcile only while this replica holds the leader Lease (--lease-*); "
        "others stand by",
    )
    sub.add_parser(
        "diagnose", help="why is this gang pending? (KIND/NAMESPACE/NAME)", add_help=False
    )
    sub.add_parser("status", help="a table of gangs in flight", add_help=False)
    return parser


def _version() -> str:
    """The installed distribution's version (the image's ``gangcheck --version``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gangcheck")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"


def _diagnose(argv: list[str]) -> int:
    from gangcheck.diagnose import main_diagnose

    return main_diagnose(argv)


def _status(argv: list[str]) -> int:
    from gangcheck.diagnose import main_status

    return main_status(argv)


# Subcommands with a parser of their own: the rest of the command line is theirs.
_DELEGATED = {"diagnose": _diagnose, "status": _status}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _DELEGATED:
        return _DELEGATED[argv[0]](argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "run":
        return _run(args)
    return 2  # pragma: no cover - argparse rejects unknown commands


# (flag, type, help, settings section, settings field)
_RUN_FLAG_FIELDS: tuple[tuple[str, type, str, str, str], ...] = (
    ("--workers", int, "concurrent reconciles", "controller", "workers"),
    ("--log-level", str, "DEBUG, INFO, WARNING, ERROR or CRITICAL", "logging", "level"),
    ("--lease-namespace", str, "namespace of the leader Lease", "leader_election", "namespace"),
    ("--lease-name", str, "name of the leader Lease", "leader_election", "name"),
    ("--identity", str, "this replica on the lease", "leader_election", "identity"),
    ("--lease-duration", float, "seconds", "leader_election", "lease_duration_seconds"),
    ("--renew-deadline", float, "seconds", "leader_election", "renew_deadline_seconds"),
    ("--retry-period", float, "seconds", "leader_election", "retry_period_seconds"),
    ("--health-port", int, "/healthz and /readyz", "server", "health_port"),
    ("--metrics-port", int, "/metrics", "server", "metrics_port"),
    ("--bind-address", str, "address to serve on", "server", "bind_address"),
    ("--webhook-port", int, "serve the gating webhook on this port", "webhook", "port"),
    ("--webhook-cert-dir", str, "tls.crt and tls.key of the webhook", "webhook", "cert_dir"),
    (
        "--worker-lease-namespace",
        str,
        "dispatcher: namespace of gangcheck's leader Lease in each worker",
        "dispatcher",
        "worker_lease_namespace",
    ),
    (
        "--worker-lease-name",
        str,
        "dispatcher: name of gangcheck's leader Lease in each worker",
        "dispatcher",
        "worker_lease_name",
    ),
    (
        "--worker-answer-within",
        float,
        "dispatcher: seconds a pass waits for one worker's reads before it skips the worker",
        "dispatcher",
        "worker_answer_within_seconds",
    ),
    (
        "--round-wait",
        float,
        "dispatcher: seconds a gang every worker failed for waits before they are all tried "
        "again (doubled each round)",
        "dispatcher",
        "round_wait_seconds",
    ),
    (
        "--round-wait-max",
        float,
        "dispatcher: the longest wait between two rounds, in seconds",
        "dispatcher",
        "round_wait_max_seconds",
    ),
)
_RUN_FLAGS = tuple((flag, kind, text) for flag, kind, text, _, _ in _RUN_FLAG_FIELDS)


def _settings(args: argparse.Namespace) -> Any:
    """The settings file and environment, overridden by the flags given (validated as the
    file is: a flag's value the file would refuse is refused, naming the flag)."""
    from gangcheck.settings import load_settings

    settings = load_settings(args.config, os.environ)
    updates: dict[str, dict[str, Any]] = {}
    flags: dict[tuple[str, str], str] = {}
    for flag, _, _, section, field in _RUN_FLAG_FIELDS:
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if value is not None:
            updates.setdefault(section, {})[field] = value
            flags[section, field] = flag
    if args.leader_elect:
        updates.setdefault("leader_election", {})["enabled"] = True
    if args.webhook_port is not None:
        updates.setdefault("webhook", {})["enabled"] = True
    sections = {
        name: _updated(getattr(settings, name), fields, flags, name)
        for name, fields in updates.items()
    }
    return settings.model_copy(update=sections)


def _updated(
    section: Any, fields: dict[str, Any], flags: dict[tuple[str, str], str], name: str
) -> Any:
    """`section` with `fields` set, validated; a refusal names the flag that set the field."""
    from pydantic import ValidationError

    from gangcheck.settings import SettingsError

    try:
        return type(section).model_validate({**section.model_dump(), **fields})
    except ValidationError as e:
        problems = []
        for item in e.errors():
            field = str(item["loc"][0]) if item["loc"] else ""
            by_name = {info.alias or key: key for key, info in type(section).model_fields.items()}
            flag = flags.get((name, by_name.get(field, field)), f"{name}.{field}".rstrip("."))
            problems.append(f"{flag}: {_plain(str(item['msg']))}")
        raise SettingsError(problems) from e


def _plain(message: str) -> str:
    return message.removeprefix("Value error, ").replace("Input should be", "must be")


def _run(args: argparse.Namespace) -> int:
    from gangcheck.app import RunOptions, WebhookOptions, run_controller, run_dispatcher
    from gangcheck.kube.client import Kube, KubeconfigError
    from gangcheck.kube.errors import ApiError
    from gangcheck.logic.dispatch import RoundWait
    from gangcheck.reconcile.podgroup import PodGroupOptions
    from gangcheck.runtime.leader import LeaseConfig
    from gangcheck.settings import SettingsError
    from gangcheck.telemetry import setup_logging, setup_tracing

    if args.dispatch_at_once < 1:
        print("gangcheck: invalid settings: --dispatch-at-once: must be 1 or more", file=sys.stderr)
        return 2
    try:
        settings = _settings(args)
    except SettingsError as e:
        print(f"gangcheck: invalid settings: {e}", file=sys.stderr)
        return 2
    setup_logging(settings.logging.level, json_lines=settings.logging.json_lines)
    setup_tracing(settings.tracing.otlp_endpoint, settings.tracing.service_name)
    election = settings.leader_election
    if args.role == "dispatcher" and args.lease_name is None and election.name == "gangcheck":
        # a Lease of its own: it never stands by for a controller in the same cluster
        election = election.model_copy(update={"name": DISPATCHER_LEASE})
    lease = (
        LeaseConfig(
            election.namespace,
            election.name,
            identity=election.identity or _identity(),
            lease_duration=election.lease_duration_seconds,
            renew_deadline=election.renew_deadline_seconds,
            retry_period=election.retry_period_seconds,
        )
        if election.enabled
        else None
    )
    options = RunOptions(
        workers=settings.controller.workers,
        leader_election=lease,
        bind_address=settings.server.bind_address,
        health_port=settings.server.health_port,
        metrics_port=settings.server.metrics_port,
        pod_groups=(
            PodGroupOptions(settings.pod_groups.config, settings.pod_groups.max_members)
            if settings.pod_groups.enabled
            else None
        ),
        discovery_seconds=settings.pod_groups.discovery_seconds,
        progress_delay_seconds=settings.controller.progress_delay_seconds,
        webhook=(
            WebhookOptions(
                settings.webhook.port, settings.webhook.cert_dir, settings.webhook.drain_seconds
            )
            if settings.webhook.enabled
            else None
        ),
    )

    async def go() -> None:
        kube = await Kube.connect(args.kubeconfig, in_cluster=args.in_cluster)
        async with kube:
            await _reachable(kube, REACH_SECONDS)
            if args.role == "dispatcher":
                work = run_dispatcher(
                    kube,
                    options,
                    at_once=args.dispatch_at_once,
                    worker_lease=(
                        settings.dispatcher.worker_lease_namespace,
                        settings.dispatcher.worker_lease_name,
                    ),
                    answer_within=settings.dispatcher.worker_answer_within_seconds,
                    rounds=RoundWait(
                        settings.dispatcher.round_wait_seconds,
                        settings.dispatcher.round_wait_max_seconds,
                    ),
                )
            else:
                work = run_controller(kube, options)
            await _until_terminated(work)

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(go())
    except KubeconfigError as e:
        return _fail(str(e))
    except ApiError as e:
        return _fail(_unanswered(e))
    return 0


async def _reachable(kube: Kube, seconds: float) -> None:
    """Return once the API server answers ``/version``; raise its error after `seconds` of
    failing to reach it, or at once on an answer that is not a transient failure (401 ...)."""
    from gangcheck.kube.errors import TransientError

    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        try:
            await kube.request("GET", "/version")
            return
        except TransientError:
            if asyncio.get_running_loop().time() >= deadline:
                raise
        await asyncio.sleep(1)


def _unanswered(error: ApiError) -> str:
    if error.status == 0:
        return f"cannot reach the API server: {error.message}"
    return f"the API server answered {error.status} {error.reason}: {error.message}"


def _fail(message: str) -> int:
    print(f"gangcheck: {message.splitlines()[0] if message else 'failed'}", file=sys.stderr)
    return 1


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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
