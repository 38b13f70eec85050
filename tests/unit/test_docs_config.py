"""The docs a platform engineer acts on, held to the code: every AtomicProvisioningConfig field
(the model, the CRD, docs/configure.md's table), every config in the docs and the examples,
the bad-input table, and the names the docs quote (metrics, reasons, commands, chart values,
paths, links). A rename in the code that the docs still quote fails here."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from gangcheck import cli
from gangcheck.diagnose.fetch import target_of
from gangcheck.model.provisioning_config import (
    AtomicProvisioningSpec,
    CapacitySource,
    parse_spec,
)
from gangcheck.settings import SettingsError, load_settings
from gangcheck.telemetry import METRICS, Metrics

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "manifests" / "crd" / "gangcheck.io_atomicprovisioningconfigs.yaml"
HELM = REPO / "manifests" / "helm" / "gangcheck"
CONFIGURE = REPO / "docs" / "configure.md"
#: The docs a new user reads first (docs/karpenter.md also quotes Karpenter's own Go names).
USER_DOCS = [REPO / "README.md", CONFIGURE, REPO / "docs" / "troubleshooting.md"]
DOCS = [*USER_DOCS, REPO / "docs" / "karpenter.md"]
CHART_TEXT = [HELM / "values.yaml", HELM / "templates" / "NOTES.txt"]


def _spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    [version] = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def _section(text: str, heading: str) -> str:
    """The text under `heading` up to the next heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    start = text.index(heading + "\n")
    rest = text[start + len(heading) + 1 :]
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", rest, re.M)]
    return rest[: ends[0]] if ends else rest


def _rows(text: str) -> Iterator[list[str]]:
    """The cells of each body row of the markdown tables in `text`."""
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            yield [c.strip() for c in line.strip().strip("|").split(" | ")]


# ---- the fields: model, CRD, docs --------------------------------------------------------


def _model_paths(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Every field of `model` by its API path (nested models and lists of them opened)."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        path = prefix + (info.alias or name)
        out[path] = info
        for inner in _models_in(info.annotation):
            out.update(_model_paths(inner, path + "."))
    return out


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _models_in(arg)]


def _schema_paths(schema: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, sub in (schema.get("properties") or {}).items():
        path = prefix + key
        out[path] = sub
        inner = sub.get("items", sub) if sub.get("type") == "array" else sub
        out.update(_schema_paths(inner, path + "."))
    return out


def test_the_model_and_the_crd_name_the_same_fields() -> None:
    model = set(_model_paths(AtomicProvisioningSpec))
    schema = set(_schema_paths(_spec_schema()))
    assert sorted(model - schema) == [], "fields the CRD would prune"
    assert sorted(schema - model) == [], "fields the model refuses"


def test_the_crds_defaults_are_the_models() -> None:
    fields = _model_paths(AtomicProvisioningSpec)
    for path, sub in _schema_paths(_spec_schema()).items():
        if "default" not in sub or sub["default"] == {}:
            continue
        default = fields[path].default
        assert getattr(default, "value", default) == sub["default"], path


def test_the_chart_ships_the_same_crd() -> None:
    assert (HELM / "crds" / CRD.name).read_text() == CRD.read_text()


def _table_defaults() -> dict[str, str]:
    table = _section(
        CONFIGURE.read_text(),
        "## AtomicProvisioningConfig (`gangcheck.io/v1alpha1`, cluster-scoped)",
    )
    return {row[0].strip("`"): row[1] for row in _rows(table) if row[0].startswith("`")}


def test_every_field_is_in_the_configure_table_with_its_default() -> None:
    documented = _table_defaults()
    fields = _model_paths(AtomicProvisioningSpec)
    # leaves: a nested model's fields are the rows, not the model (capacitySources and
    # reservations are lists whose items are described beside the table)
    listed = {
        "capacitySources",
        "reservations",
        "podSetUpdates.nodeSelector",
        "podGroups.namespaceSelector",
    }
    wanted = {
        path
        for path in fields
        if path in listed
        or (
            not any(path.startswith(f"{p}.") for p in listed)
            and not _models_in(fields[path].annotation)
        )
    }
    assert sorted(wanted - set(documented)) == [], "fields the table does not describe"
    assert sorted(set(documented) - set(fields)) == [], "rows naming no field"
    for path, cell in documented.items():
        default = fields[path].default
        default = getattr(default, "value", default)
        if path == "raceWidth":
            default = AtomicProvisioningSpec(
                capacitySources=({"nodeSelector": {"p": "a"}}, {"nodeSelector": {"p": "b"}}),
                capacitySourcePolicy="Race",
            ).racing
        if isinstance(default, bool):
            assert cell == f"`{str(default).lower()}`", path
        elif isinstance(default, str | int):
            assert cell == f"`{default}`", path


def test_every_capacity_source_field_is_described() -> None:
    section = _section(CONFIGURE.read_text(), "## Capacity sources")
    for path, info in _model_paths(CapacitySource).items():
        if _models_in(info.annotation):
            continue  # karpenter: its nodePools are the row
        assert f"`{path}`" in section or f"`{path.split('.')[-1]}`" in section, path


# ---- the configs in the docs and the examples --------------------------------------------


def _schema_problems(value: Any, schema: dict[str, Any], where: str) -> list[str]:
    """What the CRD's structural schema says of `value` (the subset it uses)."""
    problems: list[str] = []
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "integer": int, "boolean": bool}
    if kind and not isinstance(value, types[kind]):
        return [f"{where}: not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}: {value!r} not one of {schema['enum']}")
    low, high = schema.get("minimum", value), schema.get("maximum", value)
    if kind == "integer" and not low <= value <= high:
        problems.append(f"{where}: {value} out of range")
    if kind in ("array", "object", "string"):
        if len(value) < schema.get(
            "minItems", schema.get("minProperties", schema.get("minLength", 0))
        ):
            problems.append(f"{where}: too few")
        if len(value) > schema.get(
            "maxItems", schema.get("maxProperties", schema.get("maxLength", len(value)))
        ):
            problems.append(f"{where}: too many")
    if kind == "array":
        for i, item in enumerate(value):
            problems += _schema_problems(item, schema.get("items", {}), f"{where}[{i}]")
    if kind == "object":
        known = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if known is not None and key in known:
                problems += _schema_problems(item, known[key], f"{where}.{key}")
            elif isinstance(extra, dict):
                problems += _schema_problems(item, extra, f"{where}.{key}")
            elif known is not None:
                problems.append(f"{where}.{key}: unknown to the CRD (pruned)")
        for key in schema.get("required", ()):
            if key not in value:
                problems.append(f"{where}.{key}: required")
    return problems


def _configs() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every AtomicProvisioningConfig spec in the docs' YAML blocks and the examples."""
    aliases = {info.alias or name for name, info in AtomicProvisioningSpec.model_fields.items()}
    for doc in [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]:
        for i, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", doc.read_text(), re.S)):
            for item in yaml.safe_load_all(block):
                if not isinstance(item, dict):
                    continue
                if item.get("kind") == "AtomicProvisioningConfig":
                    yield f"{doc.name} block {i}", item.get("spec") or {}
                elif set(item) == {"spec"} and set(item["spec"]) <= aliases:
                    yield f"{doc.name} block {i} (a spec)", item["spec"]
    for path in sorted((REPO / "manifests" / "examples").rglob("*.yaml")):
        for item in yaml.safe_load_all(path.read_text()):
            if isinstance(item, dict) and item.get("kind") == "AtomicProvisioningConfig":
                yield str(path.relative_to(REPO)), item.get("spec") or {}


CONFIGS = list(_configs())


def test_the_docs_and_examples_hold_configs() -> None:
    where = {w.split(" ")[0] for w, _ in CONFIGS}
    assert {
        "configure.md",
        "karpenter.md",
        "manifests/examples/gpu/atomicprovisioningconfig.yaml",
    } <= where


@pytest.mark.parametrize(("where", "spec"), CONFIGS, ids=[w for w, _ in CONFIGS])
def test_every_config_in_the_docs_and_examples_is_valid(where: str, spec: dict[str, Any]) -> None:
    parse_spec(spec)
    assert _schema_problems(spec, _spec_schema(), "spec") == []


def test_the_schema_check_sees_what_the_server_would_refuse_or_prune() -> None:
    schema = _spec_schema()
    assert _schema_problems({"capacitySources": []}, schema, "spec") == [
        "spec.capacitySources: too few"
    ]
    assert _schema_problems({"fulfillment": {"deadline": 5}}, schema, "spec") == [
        "spec.fulfillment.deadline: unknown to the CRD (pruned)"
    ]
    assert _schema_problems({"raceWidth": 9}, schema, "spec") == ["spec.raceWidth: 9 out of range"]


INT32_MAX = 2**31 - 1


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"fulfillment": {"deadlineSeconds": INT32_MAX + 1}}, "fulfillment.deadlineSeconds"),
        ({"fulfillment": {"startDeadlineSeconds": 10**14}}, "fulfillment.startDeadlineSeconds"),
        ({"retryStrategy": {"backoffLimitCount": 10**18}}, "retryStrategy.backoffLimitCount"),
        (
            {"retryStrategy": {"backoffBaseSeconds": 10**14, "backoffMaxSeconds": 10**14}},
            "retryStrategy.backoffBaseSeconds",
        ),
        ({"retryStrategy": {"backoffMaxSeconds": 10**14}}, "retryStrategy.backoffMaxSeconds"),
        ({"capacitySources": [{"deadlineSeconds": 10**14}]}, "capacitySources[0].deadlineSeconds"),
        (
            {"reservations": [{"name": "r", "nodeLabels": {"a": "b"}, "nodes": 10**14}]},
            "reservations[0].nodes",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_an_integer_past_the_crds_int32_is_refused_naming_it(
    spec: dict[str, Any], field: str
) -> None:
    """The CRD says int32, which a kube-apiserver of before kube-openapi's int32 check stores
    whatever its size; gangcheck checks again what the schema checks. A deadline of 10**14 s
    otherwise passed, and every decision on a gang under it failed on a date past year 9999."""
    assert _schema_problems(spec, _spec_schema(), "spec") == []  # the schema's bounds alone
    schema = _spec_schema()
    for part in field.split("."):
        schema = schema["properties"][part.split("[")[0]]
        schema = schema["items"] if "[" in part else schema
    assert (schema["type"], schema["format"]) == ("integer", "int32")
    with pytest.raises(ValueError) as refused:
        parse_spec(spec)
    assert str(refused.value).startswith(f"spec.{field}: "), str(refused.value)


# ---- bad input: the table in docs/configure.md is what gangcheck answers -------------------


def _bad_input_rows() -> list[tuple[dict[str, Any], str]]:
    section = _section(CONFIGURE.read_text(), "## Bad input")
    rows = []
    for cells in _rows(section):
        if not cells[0].startswith("`{"):
            continue
        raw = cells[0].split("`")[1].replace('"<300 characters>"', json.dumps("x" * 300))
        rows.append((json.loads(raw), cells[1].strip("`")))
    return rows


BAD_INPUT = _bad_input_rows()


def test_the_bad_input_table_has_rows() -> None:
    assert len(BAD_INPUT) >= 10


@pytest.mark.parametrize(("spec", "said"), BAD_INPUT, ids=[s for _, s in BAD_INPUT])
def test_bad_input_gets_the_documented_message_naming_the_field(
    spec: dict[str, Any], said: str
) -> None:
    with pytest.raises(ValueError) as refused:
        parse_spec(spec)
    message = str(refused.value)
    assert message.startswith("spec."), message
    at = 0
    for part in (p.strip() for p in said.split("…")):
        found = message.find(part, at)
        assert found >= 0, f"{part!r} not in {message!r}"
        at = found + len(part)


def test_the_settings_error_the_docs_quote() -> None:
    quoted = re.search(r"e\.g\. `(unknown key \"(\w+)\" in (\w+))`", CONFIGURE.read_text())
    assert quoted is not None
    with pytest.raises(SettingsError) as refused:
        load_settings(None, {f"GANGCHECK_{quoted[3].upper()}__{quoted[2].upper()}": "8"})
    assert quoted[1] in str(refused.value)


# ---- names the docs quote ------------------------------------------------------------------


def _source_text() -> str:
    return "\n".join(p.read_text() for p in sorted((REPO / "gangcheck").rglob("*.py")))


#: The observable instruments telemetry.Metrics makes besides those of METRICS.
OBSERVED = (
    "gangcheck_inflight_gangs",
    "gangcheck_trace_spans_exported",
    "gangcheck_trace_spans_dropped",
    "gangcheck_trace_spans_queued",
    "gangcheck_dispatch_waiting_gangs",
    "gangcheck_workqueue_depth",
    "gangcheck_leader",
)


def test_the_metrics_the_docs_name_are_served() -> None:
    served = set(METRICS) | set(OBSERVED)
    for doc in [*DOCS, *CHART_TEXT]:
        for name in set(re.findall(r"\bgangcheck_[a-z_]+", doc.read_text())):
            base = re.sub(r"_(total|bucket|sum|count)$", "", name)
            assert base in served, f"{doc.name}: {name}"


#: Reasons and values the docs quote that the code writes without spelling them out whole.
COMPOSED = {"ProvisioningRequestCreated": 'Event(f"{backend.kind}Created"'}
#: Names the docs quote from Kueue and Karpenter (a feature gate, an Event reason of theirs).
THEIRS = {"ElasticJobsViaWorkloadSlices", "InsufficientCapacityError"}


def test_the_reasons_the_docs_quote_are_written_by_the_code() -> None:
    """Every `CamelCase` word the user docs quote (Event and condition reasons, states,
    enum values) is a string the code has."""
    source = _source_text()
    for doc in USER_DOCS:
        for word in set(re.findall(r"`([A-Z][a-z]+(?:[A-Z][a-z]*)+)`", doc.read_text())):
            assert f'"{word}"' in source or word in {*COMPOSED, *THEIRS}, f"{doc.name}: {word}"


def _commands() -> Iterator[tuple[str, list[str]]]:
    for doc in [*DOCS, *CHART_TEXT]:
        text = doc.read_text()
        lines = re.findall(r"^(gangcheck (?:run|diagnose|status)\b[^#\n]*)", text, re.M)
        inline = re.findall(r"`(gangcheck (?:run|diagnose|status)\b[^`]*)`", text)
        for line in [*lines, *inline]:
            yield doc.name, line.split()[1:]
    extra = re.search(r"e\.g\. \[(--[^\]]+)\]", (HELM / "values.yaml").read_text())
    assert extra is not None
    yield "values.yaml extraArgs", ["run", extra[1]]


COMMANDS = list(_commands())


@pytest.mark.parametrize(("doc", "argv"), COMMANDS, ids=[" ".join(a) for _, a in COMMANDS])
def test_the_commands_in_the_docs_parse(doc: str, argv: list[str]) -> None:
    command, *rest = argv
    if rest == ["--help"]:
        return  # every subcommand has it
    if command == "run":
        cli._parser().parse_args(argv)
    elif command == "diagnose":
        targets = [a for a in rest if not a.startswith("-") and a not in ("text", "json")]
        for target in targets:
            target_of(target.replace("…", "NS/NAME"))
    else:
        flags = {"-n", "--namespace", "-o", "--output", "--kubeconfig"}
        assert {a for a in rest if a.startswith("-")} <= flags


def test_the_chart_values_the_docs_name_exist() -> None:
    values = yaml.safe_load((HELM / "values.yaml").read_text())
    named = set()
    for doc in [*DOCS, HELM / "templates" / "NOTES.txt", REPO / "docs" / "install.md"]:
        # key=value of a chart value (a label such as gangcheck.io/do-not-reclaim=true is not)
        found = re.findall(
            r"(?<![\w./-])([a-zA-Z]+(?:\.[a-zA-Z]+)*)=(?:true|false|reader)\b", doc.read_text()
        )
        named |= set(found)
    assert named, "the docs name no chart value"
    for key in named:
        node: Any = values
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, key
            node = node[part]


def test_the_paths_the_docs_name_exist() -> None:
    pattern = (
        r"(?<![\w./~-])((?:gangcheck|manifests|docs|tests|hack|config|kind|benchmarks)/[\w./*-]*\w)"
    )
    for doc in [*DOCS, *CHART_TEXT, REPO / "config" / "gangcheck.yaml"]:
        for path in set(re.findall(pattern, doc.read_text())):
            assert list(REPO.glob(path)) or list(REPO.glob(path + "*")), f"{doc.name}: {path}"


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_links_between_the_docs_resolve() -> None:
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)]+)\)", doc.read_text()):
            if target.startswith("http"):
                continue
            path, _, anchor = target.partition("#")
            linked = doc.parent / path if path else doc
            assert linked.exists(), f"{doc.name}: {target}"
            if anchor:
                headings = re.findall(r"^#+ (.*)$", linked.read_text(), re.M)
                assert anchor in {_slug(h) for h in headings}, f"{doc.name}: {target}"


def test_the_annotations_and_labels_the_docs_name_are_the_codes() -> None:
    source = _source_text()
    for doc in [*DOCS, *CHART_TEXT, REPO / "config" / "gangcheck.yaml"]:
        for key in set(re.findall(r"gangcheck\.io/[a-z0-9-]*[a-z0-9]", doc.read_text())):
            if key == "gangcheck.io/v1alpha1":
                continue  # the API version
            assert f'"{key}"' in source, f"{doc.name}: {key}"


def test_the_run_flags_that_override_settings_are_listed() -> None:
    section = _section(CONFIGURE.read_text(), "## The controller's own settings")
    listed = set(re.findall(r"`(--[a-z-]+)", section))
    overriding = {flag for flag, *_ in cli._RUN_FLAG_FIELDS} | {"--leader-elect"}
    assert listed == overriding


def test_a_flag_refused_is_named_as_the_docs_say(capsys: pytest.CaptureFixture[str]) -> None:
    quoted = re.search(r"`(--workers: [^`]+)`", CONFIGURE.read_text())
    assert quoted is not None
    assert cli.main(["run", "--workers", "0"]) == 2
    assert quoted[1].replace("\n", " ") in capsys.readouterr().err


def test_every_metric_is_in_the_metrics_page() -> None:
    page = (REPO / "docs" / "metrics.md").read_text()
    for name in [*METRICS, *OBSERVED]:
        assert f"`{name}" in page, name


def test_the_observed_instruments_are_those_the_metrics_render() -> None:
    typed = re.findall(r"^# TYPE (\S+)", Metrics().render(), re.M)
    rendered = {name.removesuffix("_total") for name in typed}
    assert set(OBSERVED) <= rendered
