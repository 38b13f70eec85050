"""The controller's own settings: grouped in sections, each field documented, validated once.

Read from a YAML file (``config/gangcheck.yaml`` documents every field), then overridden by
environment variables named ``GANGCHECK_<SECTION>__<FIELD>``, e.g.
``GANGCHECK_CONTROLLER__WORKERS=8`` or ``GANGCHECK_LEADER_ELECTION__LEASE_DURATION_SECONDS=30``
(case and underscores inside a name do not matter). Every problem is reported at once, as a
``SettingsError`` whose message names each field by its path in the file.
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args
from urllib.parse import unquote, urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gangcheck.logic.dispatch import ANSWER_WITHIN, ROUND_WAIT, ROUND_WAIT_MAX
from gangcheck.model.names import CONFIG_ANNOTATION, is_dns_label, is_dns_subdomain

ENV_PREFIX = "GANGCHECK_"
ENV_SEPARATOR = "__"
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


class SettingsError(ValueError):
    """The settings are invalid; ``problems`` has one line per problem, each naming its field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


class _Rule(ValueError):
    """A rule across fields, broken: reported as ``<section>.<field>: <message>``."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


#: Concurrent reconciles. A reconcile spends most of its time waiting for the API server's
#: answers (its decisions take milliseconds): with 4, a burst of gangs queued behind workers
#: that were all waiting (issue 31: 16-18 % of one core used, Provisioned -> Ready 5-38x
#: Kueue's check at its shipped 5 workers per controller).
DEFAULT_WORKERS = 16


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class ControllerSettings(_Section):
    """How much work one controller process does at once, and how often it starts over."""

    workers: Annotated[
        int,
        Field(
            ge=1,
            le=64,
            description="Reconciles run concurrently (one key is never reconciled twice at once).",
        ),
    ] = DEFAULT_WORKERS
    resync_seconds: Annotated[
        int,
        Field(
            alias="resyncSeconds",
            ge=0,
            description=(
                "Seconds between full resyncs, when every cached object is queued again even "
                "without a change; 0 turns the periodic resync off."
            ),
        ),
    ] = 300
    watch_timeout_seconds: Annotated[
        int,
        Field(
            alias="watchTimeoutSeconds",
            ge=10,
            le=3600,
            description=(
                "Seconds a watch stays open before it is renewed from the last resourceVersion "
                "(the server-side timeoutSeconds of each watch request)."
            ),
        ),
    ] = 300
    progress_delay_seconds: Annotated[
        float,
        Field(
            alias="progressDelaySeconds",
            ge=0,
            le=60,
            description=(
                "Seconds a status write that changes only a progress message is held, to be "
                "made with the message of then; a write that changes anything else, or whose "
                "message tells of a request withdrawn (a Workload's check) or comes with an "
                "Event (a PodGroup's), is made at once. 0 writes every message at once."
            ),
        ),
    ] = 3.0


#: gangcheck's leader Lease by default (``leaderElection``): where the dispatcher looks for it
#: in each worker too (``dispatcher.workerLeaseNamespace``, ``dispatcher.workerLeaseName``).
LEASE_NAMESPACE = "gangcheck-system"
LEASE_NAME = "gangcheck"


class LeaderElectionSettings(_Section):
    """The coordination.k8s.io Lease that lets one replica act while the others stand by."""

    enabled: Annotated[
        bool,
        Field(
            description=(
                "Hold a Lease so only one replica reconciles; turn off only when exactly one "
                "replica runs."
            )
        ),
    ] = True
    namespace: Annotated[
        str,
        Field(min_length=1, max_length=63, description="Namespace of the Lease."),
    ] = LEASE_NAMESPACE
    name: Annotated[
        str,
        Field(min_length=1, max_length=253, description="Name of the Lease."),
    ] = LEASE_NAME
    identity: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=128,
            description=(
                "This replica's name on the Lease (holderIdentity); unset: the host name plus "
                "a random suffix. In a pod, the pod's name is a good choice."
            ),
        ),
    ] = None
    lease_duration_seconds: Annotated[
        float,
        Field(
            alias="leaseDurationSeconds",
            gt=0,
            description=(
                "Seconds a standby waits, after the last renewal it saw, before it takes the Lease."
            ),
        ),
    ] = 15.0
    renew_deadline_seconds: Annotated[
        float,
        Field(
            alias="renewDeadlineSeconds",
            gt=0,
            description=(
                "Seconds after its last renewal began that the leader keeps writing; past it, "
                "it stops acting until a renewal succeeds, and gives up leading (exits) only "
                "once leaseDurationSeconds pass unrenewed. Must be below leaseDurationSeconds."
            ),
        ),
    ] = 10.0
    retry_period_seconds: Annotated[
        float,
        Field(
            alias="retryPeriodSeconds",
            gt=0,
            description=(
                "Seconds between attempts to acquire or renew the Lease; must be below "
                "renewDeadlineSeconds."
            ),
        ),
    ] = 2.0

    @field_validator("namespace")
    @classmethod
    def _namespace_is_a_label(cls, value: str) -> str:
        if not is_dns_label(value):
            raise ValueError("must be a DNS label (lowercase letters, digits and '-')")
        return value

    @field_validator("name")
    @classmethod
    def _name_is_a_subdomain(cls, value: str) -> str:
        if not is_dns_subdomain(value):
            raise ValueError("must be a DNS subdomain (lowercase letters, digits, '-' and '.')")
        return value

    @model_validator(mode="after")
    def _timings_nest(self) -> LeaderElectionSettings:
        if self.lease_duration_seconds <= self.renew_deadline_seconds:
            raise _Rule("leaseDurationSeconds", "must be greater than renewDeadlineSeconds")
        if self.renew_deadline_seconds <= self.retry_period_seconds:
            raise _Rule("renewDeadlineSeconds", "must be greater than retryPeriodSeconds")
        return self


Port = Annotated[int, Field(ge=1, le=65535)]


class ServerSettings(_Section):
    """The HTTP endpoints: health and readiness probes, Prometheus metrics."""

    health_port: Annotated[
        Port,
        Field(alias="healthPort", description="Port of /healthz (liveness) and /readyz."),
    ] = 8081
    metrics_port: Annotated[
        Port,
        Field(alias="metricsPort", description="Port of /metrics (Prometheus exposition)."),
    ] = 8080
    bind_address: Annotated[
        str,
        Field(
            alias="bindAddress",
            description="IP address both servers listen on; 0.0.0.0 means every interface.",
        ),
    ] = "0.0.0.0"

    @field_validator("bind_address")
    @classmethod
    def _is_an_ip(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError("must be an IP address, like 0.0.0.0 or 127.0.0.1") from None
        return value

    @model_validator(mode="after")
    def _ports_differ(self) -> ServerSettings:
        if self.health_port == self.metrics_port:
            raise _Rule("metricsPort", "must differ from healthPort")
        return self


class LoggingSettings(_Section):
    """Log lines on stderr."""

    level: Annotated[
        LogLevel,
        Field(description="Lowest level logged: DEBUG, INFO, WARNING, ERROR or CRITICAL."),
    ] = "INFO"
    json_lines: Annotated[
        bool,
        Field(
            alias="json",
            description=(
                "One JSON object per line, carrying the object reference (else plain text)."
            ),
        ),
    ] = True

    @field_validator("level", mode="before")
    @classmethod
    def _upper_case(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value


class TracingSettings(_Section):
    """OpenTelemetry traces: one span per reconcile, exported over OTLP/HTTP when configured
    here or by the standard ``OTEL_EXPORTER_OTLP_*`` variables (see ``otlp_traces``)."""

    otlp_endpoint: Annotated[
        str | None,
        Field(
            alias="otlpEndpoint",
            description=(
                "OTLP/HTTP endpoint traces are sent to: the collector's base address, e.g. "
                "http://otel-collector.observability:4318 (/v1/traces is appended), or the "
                "full URL ending in /v1/traces. Unset (the default): the OTEL_EXPORTER_OTLP_* "
                "variables decide, and without them no traces are sent."
            ),
        ),
    ] = None
    service_name: Annotated[
        str,
        Field(
            alias="serviceName",
            min_length=1,
            description="service.name of the exported spans.",
        ),
    ] = "gangcheck"

    @field_validator("otlp_endpoint")
    @classmethod
    def _is_a_url(cls, value: str | None) -> str | None:
        if value is not None:
            problem = _url_problem(value)
            if problem:
                raise ValueError(problem)
        return value


OTLP_TRACES_PATH = "/v1/traces"
OTLP_TIMEOUT_MS = 10_000
"""The OTel specification's default export timeout (OTEL_EXPORTER_OTLP_TIMEOUT)."""
SPAN_QUEUE_SIZE = 2048
"""The OTel specification's default span queue (OTEL_BSP_MAX_QUEUE_SIZE)."""
SCHEDULE_DELAY_MS = 5000
"""The OTel specification's default delay between two exports (OTEL_BSP_SCHEDULE_DELAY)."""
_OTLP = "OTEL_EXPORTER_OTLP_"


@dataclass(frozen=True)
class OtlpTraces:
    """Where spans go and how: resolved once, at start, from ``tracing.otlpEndpoint`` and the
    standard ``OTEL_EXPORTER_OTLP_*`` / ``OTEL_BSP_*`` environment variables."""

    endpoint: str
    """The full URL spans are posted to (ends in /v1/traces unless a variable said otherwise)."""
    source: str
    """The setting or variable the endpoint came from, for messages."""
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_seconds: float = OTLP_TIMEOUT_MS / 1000
    queue_size: int = SPAN_QUEUE_SIZE
    delay_seconds: float = SCHEDULE_DELAY_MS / 1000


def otlp_traces(tracing: TracingSettings, env: Mapping[str, str]) -> OtlpTraces | None:
    """The trace export gangcheck runs with, or None when traces are off.

    The endpoint, by precedence: ``tracing.otlpEndpoint`` (a base address gets /v1/traces
    appended; a URL already ending in /v1/traces is kept), then
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (used as it is, as the OTel specification says),
    then ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a base: /v1/traces is appended). Headers and the
    timeout (milliseconds, as specified) come from the traces variable, else the generic one.
    ``OTEL_SDK_DISABLED=true`` turns traces off. Bad values raise ``SettingsError`` naming
    the variable. The span queue's size and the delay between exports come from
    ``OTEL_BSP_MAX_QUEUE_SIZE`` and ``OTEL_BSP_SCHEDULE_DELAY`` (milliseconds).
    """
    env = {k: v for k, v in env.items() if v.strip()}  # the spec: empty means unset
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    found = _endpoint(tracing, env)
    if found is None:
        return None
    endpoint, source = found
    problems: list[str] = []
    headers = _headers(env, problems)
    timeout = _positive(env, ("TRACES_TIMEOUT", "TIMEOUT"), OTLP_TIMEOUT_MS, problems)
    queue = _positive(env, ("OTEL_BSP_MAX_QUEUE_SIZE",), SPAN_QUEUE_SIZE, problems)
    delay = _positive(env, ("OTEL_BSP_SCHEDULE_DELAY",), SCHEDULE_DELAY_MS, problems)
    protocol_var = _first(env, (f"{_OTLP}TRACES_PROTOCOL", f"{_OTLP}PROTOCOL"))
    if protocol_var and env[protocol_var].strip() != "http/protobuf":
        problems.append(
            f"{protocol_var}: gangcheck exports over OTLP/HTTP, so it must be http/protobuf "
            f"(or unset), got {env[protocol_var]!r}"
        )
    if problems:
        raise SettingsError(problems)
    return OtlpTraces(
        endpoint,
        source,
        headers,
        timeout_seconds=timeout / 1000,
        queue_size=int(queue),
        delay_seconds=delay / 1000,
    )


def _endpoint(tracing: TracingSettings, env: Mapping[str, str]) -> tuple[str, str] | None:
    if tracing.otlp_endpoint:
        return _signal_url(tracing.otlp_endpoint, keep_full=True), "tracing.otlpEndpoint"
    for var, as_base in ((f"{_OTLP}TRACES_ENDPOINT", False), (f"{_OTLP}ENDPOINT", True)):
        if var in env:
            value = env[var].strip()
            problem = _url_problem(value)
            if problem:
                raise SettingsError([f"{var}: {problem}"])
            return (_signal_url(value, keep_full=False) if as_base else value), var
    return None


def _signal_url(base: str, *, keep_full: bool) -> str:
    """The traces URL of a base address: its path (if any) followed by /v1/traces."""
    path = urlsplit(base).path.rstrip("/")
    if keep_full and path.endswith(OTLP_TRACES_PATH):
        return base
    return base.rstrip("/") + OTLP_TRACES_PATH


def _url_problem(value: str) -> str | None:
    expected = f"must be an http:// or https:// URL with a host, got {value!r}"
    try:
        parts = urlsplit(value)
        _ = parts.port  # raises on a port that is not a number in range
    except ValueError:
        return expected
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in value:
        return expected
    return None


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((name for name in names if name in env), None)


def _headers(env: Mapping[str, str], problems: list[str]) -> dict[str, str]:
    """``key1=value1,key2=value2`` (values percent-encoded), as the specification writes them."""
    var = _first(env, (f"{_OTLP}TRACES_HEADERS", f"{_OTLP}HEADERS"))
    if var is None:
        return {}
    headers: dict[str, str] = {}
    for item in env[var].split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            problems.append(f"{var}: expected key=value pairs separated by commas, got {item!r}")
            continue
        headers[unquote(key.strip()).lower()] = unquote(value.strip())
    return headers


def _positive(
    env: Mapping[str, str], names: tuple[str, ...], default: int, problems: list[str]
) -> float:
    """A positive number from the first variable set (``TIMEOUT`` names get the OTLP prefix)."""
    full = tuple(name if name.startswith("OTEL_BSP") else _OTLP + name for name in names)
    var = _first(env, full)
    if var is None:
        return float(default)
    try:
        value = float(env[var])
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        problems.append(f"{var}: expected a positive number, got {env[var]!r}")
        return float(default)
    return value


class PodGroupSettings(_Section):
    """The PodGroup provisioner: gangs declared by scheduling.k8s.io or scheduler-plugins
    PodGroups, held by the webhook's scheduling gate until their capacity exists."""

    enabled: Annotated[
        bool,
        Field(description="Provision for PodGroups of the APIs the server serves."),
    ] = True
    config: Annotated[
        str,
        Field(
            description=(
                "AtomicProvisioningConfig used for PodGroups that name none in the annotation "
                f"{CONFIG_ANNOTATION}; empty means the built-in defaults."
            ),
        ),
    ] = ""
    max_members: Annotated[
        int,
        Field(
            alias="maxMembers",
            ge=1,
            le=2**31 - 1,
            description="Largest gang one ProvisioningRequest is made for; larger ones fail.",
        ),
    ] = 5000
    discovery_seconds: Annotated[
        float,
        Field(
            alias="discoverySeconds",
            gt=0,
            description="How often to ask which PodGroup APIs the server serves.",
        ),
    ] = 60.0


class WebhookSettings(_Section):
    """The mutating webhook that gates PodGroup members at creation (HTTPS)."""

    enabled: Annotated[
        bool,
        Field(description="Serve the webhook (needs the certificate files below)."),
    ] = False
    port: Annotated[Port, Field(description="HTTPS port of /mutate-pods.")] = 9443
    cert_dir: Annotated[
        str,
        Field(
            alias="certDir",
            min_length=1,
            description="Folder holding tls.crt and tls.key (reloaded when they change).",
        ),
    ] = "/tmp/k8s-webhook-server/serving-certs"
    drain_seconds: Annotated[
        float,
        Field(
            alias="drainSeconds",
            ge=0,
            le=60,
            description=(
                "On SIGTERM, seconds the webhook keeps answering, the replica NotReady, while "
                "its Service endpoint is removed; keep it well within the pod's "
                "terminationGracePeriodSeconds."
            ),
        ),
    ] = 5.0


class DispatcherSettings(_Section):
    """``gangcheck run --role dispatcher`` only (docs/multicluster.md): what it reads in each
    worker to tell whether gangcheck runs there, and how long it waits for a worker's reads."""

    worker_lease_namespace: Annotated[
        str,
        Field(
            alias="workerLeaseNamespace",
            min_length=1,
            max_length=63,
            description=(
                "Namespace of gangcheck's leader Lease in each worker (its leaderElection."
                "namespace there): a Lease not renewed for its duration plus a grace marks "
                "gangcheck there down, and the worker is skipped."
            ),
        ),
    ] = LEASE_NAMESPACE
    worker_lease_name: Annotated[
        str,
        Field(
            alias="workerLeaseName",
            min_length=1,
            max_length=253,
            description=(
                "Name of gangcheck's leader Lease in each worker (its leaderElection.name)."
            ),
        ),
    ] = LEASE_NAME

    worker_answer_within_seconds: Annotated[
        float,
        Field(
            alias="workerAnswerWithinSeconds",
            gt=0,
            le=300,
            description=(
                "Seconds a pass waits for one worker's reads, all of them together: a worker "
                "that has not answered by then is skipped (unreachable: no answer within it) "
                "and skipped unread for 30 s, doubling up to 4 min while it stays silent. Raise "
                "it for workers whose lists take longer (very large clusters, far away)."
            ),
        ),
    ] = ANSWER_WITHIN

    round_wait_seconds: Annotated[
        float,
        Field(
            alias="roundWaitSeconds",
            gt=0,
            le=86400,
            description=(
                "Seconds a gang every worker has failed for waits before a new round tries "
                "every worker again (from the last one given up), doubled each round up to "
                "roundWaitMaxSeconds."
            ),
        ),
    ] = ROUND_WAIT
    round_wait_max_seconds: Annotated[
        float,
        Field(
            alias="roundWaitMaxSeconds",
            gt=0,
            le=86400,
            description="The longest wait between two rounds (seconds).",
        ),
    ] = ROUND_WAIT_MAX

    @model_validator(mode="after")
    def _round_wait_within_its_most(self) -> DispatcherSettings:
        if self.round_wait_max_seconds < self.round_wait_seconds:
            raise _Rule("roundWaitMaxSeconds", "must not be below roundWaitSeconds")
        return self

    @field_validator("worker_lease_namespace")
    @classmethod
    def _namespace_is_a_label(cls, value: str) -> str:
        return LeaderElectionSettings._namespace_is_a_label(value)

    @field_validator("worker_lease_name")
    @classmethod
    def _name_is_a_subdomain(cls, value: str) -> str:
        return LeaderElectionSettings._name_is_a_subdomain(value)


class Settings(_Section):
    """Everything the controller process reads at start; passed explicitly, never global."""

    controller: Annotated[
        ControllerSettings,
        Field(description="Concurrency and resync of the reconcilers."),
    ] = Field(default_factory=ControllerSettings)
    leader_election: Annotated[
        LeaderElectionSettings,
        Field(alias="leaderElection", description="The Lease that elects the acting replica."),
    ] = Field(default_factory=LeaderElectionSettings)
    server: Annotated[
        ServerSettings,
        Field(description="Health, readiness and metrics endpoints."),
    ] = Field(default_factory=ServerSettings)
    logging: Annotated[LoggingSettings, Field(description="Log level and format.")] = Field(
        default_factory=LoggingSettings
    )
    tracing: Annotated[TracingSettings, Field(description="OpenTelemetry traces.")] = Field(
        default_factory=TracingSettings
    )
    pod_groups: Annotated[
        PodGroupSettings,
        Field(alias="podGroups", description="Gangs declared by PodGroups (no Kueue)."),
    ] = Field(default_factory=PodGroupSettings)
    webhook: Annotated[
        WebhookSettings,
        Field(description="The pod scheduling-gate webhook."),
    ] = Field(default_factory=WebhookSettings)
    dispatcher: Annotated[
        DispatcherSettings,
        Field(description="The MultiKueue dispatcher (--role dispatcher) only."),
    ] = Field(default_factory=DispatcherSettings)


SECTIONS: dict[str, type[_Section]] = {
    (info.alias or name): info.annotation  # type: ignore[misc]
    for name, info in Settings.model_fields.items()
}


def load_settings(
    path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None
) -> Settings:
    """Settings from the YAML file at ``path`` (defaults when None), then ``env`` overrides."""
    data = _read_file(path) if path is not None else {}
    origins: dict[tuple[str, str], str] = {}
    problems = _apply_env(data, env or {}, origins)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as e:
        problems.extend(_describe(item, origins) for item in e.errors())
    else:
        try:  # the OTEL_EXPORTER_OTLP_* variables are refused at start too
            otlp_traces(settings.tracing, env or {})
        except SettingsError as e:
            problems.extend(e.problems)
    if problems:
        raise SettingsError(problems)
    return settings


# ---- the file ------------------------------------------------------------------------


def _read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            loaded = yaml.safe_load(handle)
    except OSError as e:
        raise SettingsError([f"cannot read settings file {os.fspath(path)}: {e.strerror}"]) from e
    except yaml.YAMLError as e:
        raise SettingsError([f"settings file {os.fspath(path)} is not valid YAML: {e}"]) from e
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        got = _type_name(loaded)
        raise SettingsError([f"settings file: expected a mapping of sections, got {got}"])
    # A section whose keys are all commented out reads as null: take it as empty.
    return {
        key: {} if value is None and key in SECTIONS else value for key, value in loaded.items()
    }


# ---- the environment -----------------------------------------------------------------


def _normalized(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


def _apply_env(
    data: dict[str, Any], env: Mapping[str, str], origins: dict[tuple[str, str], str]
) -> list[str]:
    """Merge ``GANGCHECK_<SECTION>__<FIELD>`` variables into ``data``; return the problems."""
    problems: list[str] = []
    for var in sorted(env):
        if not var.upper().startswith(ENV_PREFIX) or ENV_SEPARATOR not in var:
            continue  # other GANGCHECK_* variables (say, the test bed's) are not settings
        try:
            section, key, value = _override(var, env[var])
        except ValueError as e:
            problems.append(str(e))
            continue
        target = data.setdefault(section, {})
        if isinstance(target, dict):  # else the file's section is wrong: validation says so
            target[key] = value
            origins[(section, key)] = var
    return problems


def _override(var: str, raw: str) -> tuple[str, str, Any]:
    """(section, key, value) that the variable sets; ValueError naming it if it cannot."""
    parts = var[len(ENV_PREFIX) :].split(ENV_SEPARATOR)
    if len(parts) != 2:
        raise ValueError(f"{var}: expected {ENV_PREFIX}<SECTION>{ENV_SEPARATOR}<FIELD>")
    sections = {_normalized(alias): alias for alias in SECTIONS}
    section = sections.get(_normalized(parts[0]))
    if section is None:
        raise ValueError(f'unknown section "{parts[0].lower()}" (from {var}); {_known(SECTIONS)}')
    fields = _fields(SECTIONS[section])
    key = next((k for k in fields if _normalized(k) == _normalized(parts[1])), None)
    if key is None:
        raise ValueError(
            f'unknown key "{parts[1].lower()}" in {section} (from {var}); {_known(fields)}'
        )
    try:
        return section, key, _coerce(raw, fields[key].annotation)
    except ValueError as e:
        raise ValueError(f"{section}.{key}: {e} (from {var})") from None


def _fields(model: type[BaseModel]) -> dict[str, Any]:
    """The model's fields by the name the file uses (the alias, when there is one)."""
    return {info.alias or name: info for name, info in model.model_fields.items()}


def _coerce(raw: str, annotation: Any) -> Any:
    """An environment variable's text as the field's type (ints, numbers, booleans)."""
    kinds = set(get_args(annotation)) | {annotation}
    if bool in kinds:
        if raw.strip().lower() in _TRUE | _FALSE:
            return raw.strip().lower() in _TRUE
        raise ValueError(f"expected a boolean (true or false), got {raw!r}")
    if int in kinds:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"expected an integer, got {raw!r}") from None
    if float in kinds:
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"expected a number, got {raw!r}") from None
    if type(None) in kinds and raw == "":
        return None
    return raw


# ---- messages ------------------------------------------------------------------------

_EXPECTED = {
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean (true or false)",
    "string": "a string",
    "model": "a mapping",
    "dict": "a mapping",
}


def _describe(item: Any, origins: Mapping[tuple[str, str], str]) -> str:
    loc = [str(part) for part in item["loc"]]
    where = ".".join(loc)
    kind: str = item["type"]
    if kind == "extra_forbidden":
        return _unknown_key(loc)
    error = (item.get("ctx") or {}).get("error")
    if isinstance(error, _Rule):
        return f"{'.'.join([*loc, error.field])}: {error.message}"
    is_type_error = kind.endswith(("_type", "_parsing"))
    expected = _EXPECTED.get(kind.split("_", maxsplit=1)[0]) if is_type_error else None
    if expected:
        message = f"expected {expected}, got {_type_name(item['input'])} {item['input']!r}"
    elif isinstance(error, ValueError):
        message = str(error)
    else:
        message = str(item["msg"]).replace("Input should be", "must be")
    origin = origins.get((loc[0], loc[1])) if len(loc) == 2 else None
    return f"{where}: {message}" + (f" (from {origin})" if origin else "")


def _unknown_key(loc: list[str]) -> str:
    if len(loc) == 1:
        return f'unknown key "{loc[0]}" at the top level; {_known(SECTIONS)}'
    section = SECTIONS.get(loc[0])
    fields = _fields(section) if section else {}
    return f'unknown key "{loc[-1]}" in {".".join(loc[:-1])}; {_known(fields)}'


def _known(names: Mapping[str, object]) -> str:
    return "known: " + ", ".join(names)


def _type_name(value: object) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "mapping"}
    if value is None:
        return "null"
    return names.get(type(value), "list" if isinstance(value, list) else type(value).__name__)
