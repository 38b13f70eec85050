"""The controller's settings: defaults, the file, environment overrides and what is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gangcheck.reconcile.progress import PROGRESS_DELAY_SECONDS
from gangcheck.settings import SECTIONS, Settings, SettingsError, load_settings

SHIPPED = Path(__file__).resolve().parents[2] / "config" / "gangcheck.yaml"


def settings_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "gangcheck.yaml"
    path.write_text(text)
    return str(path)


def value_at(settings: Settings, dotted: str) -> Any:
    section, field = dotted.split(".")
    section_model = next(
        getattr(settings, name)
        for name, info in Settings.model_fields.items()
        if (info.alias or name) == section
    )
    return next(
        getattr(section_model, name)
        for name, info in type(section_model).model_fields.items()
        if (info.alias or name) == field
    )


# ---- defaults and the shipped file ---------------------------------------------------


def test_no_file_and_no_environment_gives_the_defaults() -> None:
    settings = load_settings(None, {})
    assert settings == Settings()
    assert settings.controller.workers == 16
    assert settings.leader_election.enabled is True
    assert settings.leader_election.namespace == "gangcheck-system"
    assert settings.leader_election.name == "gangcheck"
    assert (settings.server.health_port, settings.server.metrics_port) == (8081, 8080)
    assert settings.logging.level == "INFO"
    assert settings.logging.json_lines is True
    assert settings.tracing.otlp_endpoint is None


def test_the_shipped_file_holds_the_defaults() -> None:
    assert load_settings(str(SHIPPED), {}) == Settings()


def test_the_shipped_file_shows_every_field_and_every_field_is_described() -> None:
    shipped = yaml.safe_load(SHIPPED.read_text())
    for section, model in SECTIONS.items():
        assert Settings.model_fields[_name(Settings, section)].description
        for name, info in model.model_fields.items():
            key = info.alias or name
            assert key in shipped[section], f"config/gangcheck.yaml lacks {section}.{key}"
            assert info.description, f"{section}.{key} has no description"


def _name(model: type[Any], alias: str) -> str:
    return next(n for n, i in model.model_fields.items() if (i.alias or n) == alias)


# ---- the file and the environment ----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        pytest.param(
            "controller:\n  workers: 8\n",
            {},
            {"controller.workers": 8, "controller.resyncSeconds": 300},
            id="a field in the file is taken and the rest keep their defaults",
        ),
        pytest.param(
            "leaderElection:\n  leaseDurationSeconds: 30\n  renewDeadlineSeconds: 20.5\n",
            {},
            {
                "leaderElection.leaseDurationSeconds": 30.0,
                "leaderElection.renewDeadlineSeconds": 20.5,
            },
            id="whole and fractional seconds are both numbers",
        ),
        pytest.param(
            "logging:\n  level: debug\n  json: false\n",
            {},
            {"logging.level": "DEBUG", "logging.json": False},
            id="the log level is read in any case",
        ),
        pytest.param(
            "controller:\n  # workers: 2\n",
            {},
            {"controller.workers": 16},
            id="a section whose keys are all commented out is empty",
        ),
        pytest.param(
            "",
            {},
            {"controller.workers": 16},
            id="an empty file gives the defaults",
        ),
        pytest.param(
            "controller:\n  workers: 8\n",
            {"GANGCHECK_CONTROLLER__WORKERS": "16"},
            {"controller.workers": 16},
            id="the environment wins over the file",
        ),
        pytest.param(
            "",
            {"GANGCHECK_LEADER_ELECTION__LEASE_DURATION_SECONDS": "30"},
            {"leaderElection.leaseDurationSeconds": 30.0},
            id="snake case names in a variable find the camel case field",
        ),
        pytest.param(
            "",
            {"gangcheck_leaderelection__renewdeadlineseconds": "12"},
            {"leaderElection.renewDeadlineSeconds": 12.0},
            id="variable names are matched whatever their case",
        ),
        pytest.param(
            "",
            {"GANGCHECK_LEADERELECTION__ENABLED": "false", "GANGCHECK_LOGGING__JSON": "yes"},
            {"leaderElection.enabled": False, "logging.json": True},
            id="booleans in variables read true and false, yes and no",
        ),
        pytest.param(
            "tracing:\n  otlpEndpoint: http://collector:4318\n",
            {"GANGCHECK_TRACING__OTLP_ENDPOINT": ""},
            {"tracing.otlpEndpoint": None},
            id="an empty variable unsets an optional field",
        ),
        pytest.param(
            "",
            {
                "GANGCHECK_TRACING__SERVICE_NAME": "gangcheck-prod",
                "GANGCHECK_SERVER__BIND_ADDRESS": "::",
            },
            {"tracing.serviceName": "gangcheck-prod", "server.bindAddress": "::"},
            id="strings in variables are taken as they are",
        ),
        pytest.param(
            "",
            {"GANGCHECK_LEADER_ELECTION__IDENTITY": "gangcheck-7d9f-abcde"},
            {"leaderElection.identity": "gangcheck-7d9f-abcde"},
            id="the lease identity can come from the pod's name",
        ),
        pytest.param(
            "",
            {"GANGCHECK_CACHE": "/somewhere", "KUBECONFIG": "/elsewhere"},
            {"controller.workers": 16},
            id="variables without a section separator are not settings",
        ),
    ],
)
def test_settings_are_read_from_the_file_then_the_environment(
    tmp_path: Path, text: str, env: dict[str, str], expected: dict[str, Any]
) -> None:
    settings = load_settings(settings_file(tmp_path, text), env)
    assert {field: value_at(settings, field) for field in expected} == expected


# ---- what is refused -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        pytest.param(
            "controller:\n  workrs: 8\n",
            {},
            'unknown key "workrs" in controller; known: workers, resyncSeconds',
            id="a misspelt key in a section is refused, naming the keys it could be",
        ),
        pytest.param(
            "controler:\n  workers: 8\n",
            {},
            'unknown key "controler" at the top level; known: controller, leaderElection',
            id="a misspelt section is refused",
        ),
        pytest.param(
            "",
            {"GANGCHECK_CONTROLLER__WORKRS": "8"},
            'unknown key "workrs" in controller (from GANGCHECK_CONTROLLER__WORKRS)',
            id="a misspelt field in a variable is refused, naming the variable",
        ),
        pytest.param(
            "",
            {"GANGCHECK_CONTROLER__WORKERS": "8"},
            'unknown section "controler" (from GANGCHECK_CONTROLER__WORKERS)',
            id="a misspelt section in a variable is refused",
        ),
        pytest.param(
            "",
            {"GANGCHECK_SERVER__HEALTH__PORT": "1"},
            "GANGCHECK_SERVER__HEALTH__PORT: expected GANGCHECK_<SECTION>__<FIELD>",
            id="a variable with too many separators is refused",
        ),
        pytest.param(
            "controller:\n  workers: four\n",
            {},
            "controller.workers: expected an integer, got string 'four'",
            id="a word where a number belongs names the field and the type",
        ),
        pytest.param(
            "controller:\n  workers: '4'\n",
            {},
            "controller.workers: expected an integer, got string '4'",
            id="a quoted number in the file is a string, not an integer",
        ),
        pytest.param(
            "leaderElection:\n  enabled: 1\n",
            {},
            "leaderElection.enabled: expected a boolean (true or false), got integer 1",
            id="a number where a boolean belongs is refused",
        ),
        pytest.param(
            "server:\n  healthPort: 8081.5\n",
            {},
            "server.healthPort: expected an integer, got number 8081.5",
            id="a fractional port is refused",
        ),
        pytest.param(
            "tracing:\n  serviceName: 7\n",
            {},
            "tracing.serviceName: expected a string, got integer 7",
            id="a number where a string belongs is refused",
        ),
        pytest.param(
            "controller: 8\n",
            {},
            "controller: expected a mapping, got integer 8",
            id="a section that is not a mapping is refused",
        ),
        pytest.param(
            "",
            {"GANGCHECK_CONTROLLER__WORKERS": "many"},
            "controller.workers: expected an integer, got 'many' "
            "(from GANGCHECK_CONTROLLER__WORKERS)",
            id="a variable that is not a number names the field and the variable",
        ),
        pytest.param(
            "",
            {"GANGCHECK_LOGGING__JSON": "maybe"},
            "logging.json: expected a boolean (true or false), got 'maybe'",
            id="a variable that is not a boolean is refused",
        ),
        pytest.param(
            "logging:\n  level: LOUD\n",
            {},
            "logging.level: must be 'DEBUG', 'INFO', 'WARNING', 'ERROR' or 'CRITICAL'",
            id="an unknown log level lists the levels",
        ),
        pytest.param(
            "controller:\n  workers: 0\n",
            {},
            "controller.workers: must be greater than or equal to 1",
            id="zero workers is refused",
        ),
        pytest.param(
            "",
            {"GANGCHECK_SERVER__METRICS_PORT": "70000"},
            "server.metricsPort: must be less than or equal to 65535 "
            "(from GANGCHECK_SERVER__METRICS_PORT)",
            id="an out of range value from a variable names the variable",
        ),
        pytest.param(
            "server:\n  bindAddress: localhost\n",
            {},
            "server.bindAddress: must be an IP address",
            id="a host name is not a bind address",
        ),
        pytest.param(
            "leaderElection:\n  namespace: Gangcheck_System\n",
            {},
            "leaderElection.namespace: must be a DNS label",
            id="a lease namespace that no namespace can have is refused",
        ),
        pytest.param(
            "tracing:\n  otlpEndpoint: collector:4318\n",
            {},
            "tracing.otlpEndpoint: must be an http:// or https:// URL",
            id="an endpoint without a scheme is refused",
        ),
    ],
)
def test_a_wrong_setting_is_refused_naming_the_field(
    tmp_path: Path, text: str, env: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(settings_file(tmp_path, text), env)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        pytest.param(
            "leaderElection:\n  leaseDurationSeconds: 10\n  renewDeadlineSeconds: 10\n",
            {},
            "leaderElection.leaseDurationSeconds: must be greater than renewDeadlineSeconds",
            id="a lease no longer than the renew deadline is refused",
        ),
        pytest.param(
            "leaderElection:\n  retryPeriodSeconds: 10\n",
            {},
            "leaderElection.renewDeadlineSeconds: must be greater than retryPeriodSeconds",
            id="a retry period no shorter than the renew deadline is refused",
        ),
        pytest.param(
            "leaderElection:\n  leaseDurationSeconds: 30\n  renewDeadlineSeconds: 20\n",
            {"GANGCHECK_LEADER_ELECTION__LEASE_DURATION_SECONDS": "15"},
            "leaderElection.leaseDurationSeconds: must be greater than renewDeadlineSeconds",
            id="the rule holds on the values after the environment overrides the file",
        ),
        pytest.param(
            "server:\n  healthPort: 9000\n  metricsPort: 9000\n",
            {},
            "server.metricsPort: must differ from healthPort",
            id="health and metrics on one port are refused",
        ),
    ],
)
def test_a_rule_across_fields_is_refused_naming_the_field(
    tmp_path: Path, text: str, env: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(settings_file(tmp_path, text), env)
    assert str(raised.value) == message


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = "controller:\n  workrs: 8\nserver:\n  healthPort: x\n"
    with pytest.raises(SettingsError) as raised:
        load_settings(settings_file(tmp_path, text), {"GANGCHECK_LOGGING__JSON": "maybe"})
    problems = raised.value.problems
    assert len(problems) == 3
    assert [p.split(":")[0].split(" ")[0] for p in problems] == [
        "logging.json",
        "unknown",
        "server.healthPort",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("- controller\n", "expected a mapping of sections, got list", id="a list"),
        pytest.param("controller: [\n", "is not valid YAML", id="broken YAML"),
    ],
)
def test_a_file_that_is_not_a_settings_mapping_is_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(settings_file(tmp_path, text), {})


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(SettingsError, match=r"cannot read settings file .*nowhere\.yaml"):
        load_settings(str(missing), {})


def test_settings_are_frozen() -> None:
    settings = load_settings(None, {})
    with pytest.raises(ValueError, match="frozen"):
        settings.controller.workers = 2  # type: ignore[misc]


def test_the_progress_delay_defaults_to_the_reconcilers_own() -> None:
    assert Settings().controller.progress_delay_seconds == PROGRESS_DELAY_SECONDS
