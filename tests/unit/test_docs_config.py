"""The docs a platform engineer acts on, held to the code: every AtomicProvisioningConfig field
(the model, the CRD, docs/configure.md's table), every config in the docs and the examples,
the bad-input table, and the names the docs quote (metrics and their labels, reasons,
commands and their flags, make targets, settings variables, chart values, paths, annotation
and label keys, links), in README.md and every page of docs/ but docs/benchmarks.md (a record
of measurements, quoting other projects' internals). A rename in the code that the docs still
quote fails here."""

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
from gangcheck.diagnose import command as command_module
from gangcheck.model.provisioning_config import (
    AtomicProvisioningSpec,
    CapacitySource,
    parse_spec,
)
from gangcheck.settings import Settings, SettingsError, load_settings
from gangcheck.telemetry import METRICS, Metrics, SpanExportStats

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "manifests" / "crd" / "gangcheck.io_atomicprovisioningconfigs.yaml"
HELM = REPO / "manifests" / "helm" / "gangcheck"
CONFIGURE = REPO / "docs" / "configure.md"
#: The docs of gangcheck's use: what they name is gangcheck's (its package) or another
#: project's (THEIRS, THEIR_PATHS).
USER_DOCS = [
    REPO / "README.md",
    *(
        REPO / "docs" / f"{name}.md"
        for name in (
            "install",
            "configure",
            "troubleshooting",
            "metrics",
            "podgroups",
            "elastic",
            "multicluster",
            "karpenter",
            "capacity-hold",
            "reclaimers",
            "security",
            "webhook",
            "kueue-differences",
            "tracing",
        )
    ),
]
#: The docs of its tests and test bed, which also name the dev tooling's and the tests' own.
DEV_DOCS = [REPO / "docs" / f"{name}.md" for name in ("testing", "testbed", "e2e", "faults")]
DOCS = [*USER_DOCS, *DEV_DOCS]
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


def test_the_configure_table_says_the_crds_bounds_and_values() -> None:
    """A row's "up to N" / "at most N" is the field's largest count, "N to M" its range, and
    every value its enum allows is named in the row."""
    schema = _schema_paths(_spec_schema())
    wrong = []
    table = _section(
        CONFIGURE.read_text(),
        "## AtomicProvisioningConfig (`gangcheck.io/v1alpha1`, cluster-scoped)",
    )
    checked = 0
    for row in _rows(table):
        path, meaning = row[0].strip("`"), row[-1]
        if path not in schema:
            continue
        sub = schema[path]
        largest = sub.get("maxItems", sub.get("maxProperties", sub.get("maximum")))
        smallest = sub.get("minItems", sub.get("minimum"))
        said = re.search(r"\b(?:up to|at most) (\d+)\b", meaning)
        ranged = re.search(r"\b(\d+) to (\d+)\b", meaning)
        if said:
            checked += 1
            if int(said[1]) != largest:
                wrong.append(f"{path}: says at most {said[1]}, the CRD {largest}")
        if ranged:
            checked += 1
            if (int(ranged[1]), int(ranged[2])) != (smallest, largest):
                wrong.append(f"{path}: says {ranged[0]}, the CRD {smallest} to {largest}")
        for value in sub.get("enum", ()):
            checked += 1
            if f"`{value}`" not in meaning:
                wrong.append(f"{path}: {value} not named")
    assert wrong == []
    assert checked >= 10


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


def _settings_snippets() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every YAML block of the docs made of settings sections (a part of the settings file)."""
    sections = {info.alias or name for name, info in Settings.model_fields.items()}
    for doc in DOCS:
        for i, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", doc.read_text(), re.S)):
            for item in yaml.safe_load_all(block):
                if isinstance(item, dict) and item and set(item) <= sections:
                    yield f"{doc.name} block {i}", item


SETTINGS_SNIPPETS = list(_settings_snippets())


def test_the_docs_hold_settings_snippets() -> None:
    assert {"metrics.md", "tracing.md"} <= {w.split(" ")[0] for w, _ in SETTINGS_SNIPPETS}


@pytest.mark.parametrize(
    ("where", "snippet"), SETTINGS_SNIPPETS, ids=[w for w, _ in SETTINGS_SNIPPETS]
)
def test_every_settings_snippet_in_the_docs_is_valid(
    where: str, snippet: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "gangcheck.yaml"
    path.write_text(yaml.safe_dump(snippet))
    load_settings(path, {})


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


def test_every_page_of_the_docs_is_checked() -> None:
    pages = {page.name for page in (REPO / "docs").glob("*.md")}
    assert sorted(pages - {doc.name for doc in DOCS}) == ["benchmarks.md"]


def _source_text(*folders: str) -> str:
    return "\n".join(
        path.read_text() for folder in folders for path in sorted((REPO / folder).rglob("*.py"))
    )


SOURCE = _source_text("gangcheck")
#: What the dev docs may also name: the dev tooling's and the tests' own.
DEV_SOURCE = SOURCE + _source_text("hack/devtools", "tests")


def _source_of(doc: Path) -> str:
    return DEV_SOURCE if doc in DEV_DOCS else SOURCE


#: The observable instruments telemetry.Metrics makes besides those of METRICS.
OBSERVED = (
    "gangcheck_inflight_gangs",
    "gangcheck_trace_spans_exported",
    "gangcheck_trace_spans_dropped",
    "gangcheck_trace_spans_queued",
    "gangcheck_dispatch_waiting_gangs",
    "gangcheck_workqueue_depth",
    "gangcheck_leader",
    "gangcheck_caches_synced",
)


def test_the_metrics_the_docs_name_are_served() -> None:
    served = set(METRICS) | set(OBSERVED)
    unknown = []
    for doc in [*DOCS, *CHART_TEXT]:
        # gangcheck_dev is the dev tooling's package; gangcheck_source_* a family
        for name in set(re.findall(r"\bgangcheck_(?!dev\b)[a-z_]+\*?", doc.read_text())):
            if name.endswith("*"):
                known = any(s.startswith(name[:-1]) for s in served)
            else:
                known = re.sub(r"_(total|bucket|sum|count)$", "", name) in served
            if not known:
                unknown.append(f"{doc.name}: {name}")
    assert unknown == []


def _rendered_labels() -> dict[str, set[str]]:
    """The label names of each metric as a scrape shows them, with every kind recorded once."""
    spans = SpanExportStats()
    metrics = Metrics(spans=spans)
    metrics.attempt("ready")
    metrics.rollback("Deadline")
    metrics.reclaimed(1, 60)
    metrics.reclaim_failed("Forbidden")
    metrics.capacity_used({"new": 1})
    for outcome in ("asked", "delivered", "failed"):
        metrics.source("default", outcome, "Deadline", 1.0)
    metrics.pod_gated("scheduling.k8s.io")
    metrics.webhook_error("internal")
    metrics.api_error(500)
    metrics.api_request("GET", 200)
    metrics.quota_to_ready(1.0)
    metrics.provisioned_to_fit(1.0)
    metrics.reconciled("workload", 0.1)
    metrics.dispatch_nomination("worker")
    metrics.dispatch_fallback("worker")
    metrics.dispatch_round()
    metrics.dispatch_clusters_tried(1)
    metrics.dispatch_waiting(1, 0)
    labels: dict[str, set[str]] = {}
    for name, inside in re.findall(
        r"^(gangcheck_\w+?)(?:_total|_bucket|_sum|_count)?(?:\{(.*)\})? ", metrics.render(), re.M
    ):
        keys = set(re.findall(r'(\w+)="', inside)) - {"le"}
        labels.setdefault(name, set()).update(keys)
    return labels


def test_the_metrics_page_names_each_metrics_labels() -> None:
    rendered = _rendered_labels()
    assert sorted(set(METRICS) | set(OBSERVED)) == sorted(rendered), "a metric not recorded"
    page = (REPO / "docs" / "metrics.md").read_text()
    documented = {
        name: set(filter(None, (inside or "").split(",")))
        for row in _rows(page)
        for name, inside in re.findall(r"`(gangcheck_\w+?)(?:_total)?(?:\{([\w,]*)\})?`", row[0])
    }
    assert {name: rendered[name] for name in documented} == documented


#: Reasons and values the docs quote that the code writes without spelling them out whole.
COMPOSED = {"ProvisioningRequestCreated": 'Event(f"{backend.kind}Created"'}
#: Names the docs quote from other projects: feature gates, Event and condition reasons,
#: types, functions and fields of theirs (each found in that project's source at the version
#: the test bed pins, docs/testbed.md).
THEIRS = {
    # Kubernetes
    "GenericWorkload",
    "KubeSchedulerConfiguration",
    "TopologyAwareWorkloadScheduling",
    "UpdateStatus",
    # Kueue
    "AddAfter",
    "AdmissionCheckInactive",
    "CheckInactiveMessage",
    "CleanupProvisioningRequestsOnEviction",
    "ClientConnectionFailed",
    "ElasticJobsViaWorkloadSlices",
    "EnsureWorkloadSlices",
    "ErrInvalidPodSetUpdate",
    "FailedToStart",
    "MultiKueue",
    "MultiKueueAllowInsecureKubeconfigs",
    "MultiKueueBatchJobWithManagedBy",
    "MultiKueueWaitForWorkloadAdmitted",
    "PrepareWorkloadPatch",
    "ProvisioningACC",
    "ProvisioningRequestConfig",
    "RemoveRemoteObjects",
    "SetControllerReference",
    "TestIsMissingInCache",
    "UpdatesBatchPeriod",
    "VisibilityOnDemand",
    # cluster-autoscaler
    "CapacityIsFound",
    "CapacityIsProvisioned",
    "FetchPodTemplates",
    "ScaleDown",
    "ScaleDownEmpty",
    # Karpenter
    "AllNodesForNodeClaim",
    "CapacityBuffer",
    "CreateError",
    "GetInstanceTypes",
    "InsufficientCapacityError",
    "IsManaged",
    "LaunchFailed",
    "LaunchTimeout",
    "NewNodeClaimTemplate",
    "StaticCapacity",
    "ToNodeClaim",
    "ValidateNodeDisruptable",
    "WhenEmpty",
}


def test_the_reasons_the_docs_quote_are_written_by_the_code() -> None:
    """Every `CamelCase` word the docs quote (Event and condition reasons, states, enum
    values) is a string gangcheck or its dev tooling (the simulated cloud's Events) has, a
    class or function of theirs or of the tests (the dev docs' harness), or another
    project's name."""
    source = SOURCE + _source_text("hack/devtools")
    unknown = [
        f"{doc.name}: {word}"
        for doc in DOCS
        for word in set(re.findall(r"`([A-Z][a-z]+(?:[A-Z][a-z]*)+)`", doc.read_text()))
        if f'"{word}"' not in source
        and word not in {*COMPOSED, *THEIRS}
        and not re.search(rf"^\s*(class|def) {word}\b", DEV_SOURCE, re.M)
    ]
    assert unknown == []


def test_the_names_of_other_projects_are_not_gangchecks() -> None:
    assert sorted(word for word in THEIRS if f'"{word}"' in SOURCE) == []


def _commands() -> Iterator[tuple[str, list[str]]]:
    for doc in [*DOCS, *CHART_TEXT]:
        text = doc.read_text()
        lines = re.findall(r"^\s*(?:\$ )?(gangcheck (?:run|diagnose|status)\b[^#\n]*)", text, re.M)
        inline = re.findall(r"`(gangcheck (?:run|diagnose|status)\b[^`]*)`", text)
        for line in [*lines, *inline]:
            yield doc.name, line.split()[1:]
    extra = re.search(r"e\.g\. \[(--[^\]]+)\]", (HELM / "values.yaml").read_text())
    assert extra is not None
    yield "values.yaml extraArgs", ["run", extra[1]]


COMMANDS = sorted(set((doc, tuple(argv)) for doc, argv in _commands()))


@pytest.mark.parametrize(("doc", "argv"), COMMANDS, ids=[" ".join(a) for _, a in COMMANDS])
def test_the_commands_in_the_docs_parse(
    doc: str, argv: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each command line quoted is one gangcheck's own parsers take (a placeholder `<...>`
    read as 1); `gangcheck diagnose` alone names the command."""
    command, *rest = (re.sub(r"<[^>]*>", "1", arg) for arg in argv)
    if "--help" in rest or (command == "diagnose" and not rest):
        return
    if command == "run":
        cli._parser().parse_args([command, *rest])
    else:  # parsed by the command's own parser, which refuses with SystemExit(2)
        monkeypatch.setattr(command_module, "_main", lambda args, work: 0)
        assert cli.main([command, *rest]) == 0


def _make_targets_named(text: str) -> set[str]:
    invocation = r"make(?: [A-Z][A-Z0-9_]*=\S+)* ([a-z][\w-]*)"
    return set(re.findall(rf"`{invocation}", text)) | set(
        re.findall(rf"^\s*(?:\$ )?{invocation}", text, re.M)
    )


def test_the_make_targets_the_docs_name_exist() -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))
    unknown = [
        f"{doc.name}: make {target}"
        for doc in DOCS
        for target in _make_targets_named(doc.read_text())
        if target not in targets
    ]
    assert unknown == []
    assert {"demo", "test", "unit", "soak", "bench"} <= _make_targets_named(
        "\n".join(doc.read_text() for doc in DOCS)
    )


def _normal(name: str) -> str:
    return name.replace("_", "").lower()


def test_the_settings_variables_the_docs_name_are_settings() -> None:
    """GANGCHECK_<SECTION>__<FIELD> names a field of the settings; any other GANGCHECK_
    variable is one the project's scripts or code read."""
    sections = {
        _normal(info.alias or name): info.annotation for name, info in Settings.model_fields.items()
    }
    scripts = DEV_SOURCE + "\n".join(
        path.read_text()
        for path in [REPO / "Makefile", *(REPO / "hack").glob("*.sh"), *(REPO / "kind").glob("*")]
        if path.is_file()
    )
    unknown = []
    for doc in [*DOCS, *CHART_TEXT, REPO / "config" / "gangcheck.yaml"]:
        for variable in set(re.findall(r"\bGANGCHECK_[A-Z0-9_]*[A-Z0-9]", doc.read_text())):
            section, _, field = variable.removeprefix("GANGCHECK_").partition("__")
            if field:
                model = sections.get(_normal(section))
                fields = (
                    {_normal(info.alias or name) for name, info in model.model_fields.items()}
                    if model
                    else set()
                )
                if _normal(field) not in fields:
                    unknown.append(f"{doc.name}: {variable}")
            elif variable not in scripts:
                unknown.append(f"{doc.name}: {variable}")
    assert unknown == []


def test_the_chart_values_the_docs_name_exist() -> None:
    values = yaml.safe_load((HELM / "values.yaml").read_text())
    named: dict[str, str] = {}
    for doc in [*DOCS, HELM / "templates" / "NOTES.txt"]:
        # key=value of a chart value (a label such as gangcheck.io/do-not-reclaim=true is not,
        # nor a feature gate such as GenericWorkload=true)
        found = re.findall(
            r"(?<![\w./-])([a-z][a-zA-Z]*(?:\.[a-zA-Z]+)*)=(?:true|false|reader|dispatcher)\b",
            doc.read_text(),
        )
        named.update((key, doc.name) for key in found)
    assert named, "the docs name no chart value"
    unknown = []
    for key, doc_name in sorted(named.items()):
        node: Any = values
        for part in key.split("."):
            if not (isinstance(node, dict) and part in node):
                unknown.append(f"{doc_name}: {key}")
                break
            node = node[part]
    assert unknown == []


#: Paths the docs name in another project's repository or module.
THEIR_PATHS = {
    "config/components/crd/bases",  # Kueue's
    "config/components/crd/kustomization.yaml",
    "config/components/webhook/manifests.yaml",
    "config/default",
    "config/crd/bases/scheduling.x-k8s.io_podgroups.yaml",  # scheduler-plugins'
}


def _moved(text: str) -> set[str]:
    """The files a table of `text` says were moved to hack/devtools/tests/ (named where they
    were), each there now."""
    return {
        path
        for row in _rows(text)
        if len(row) == 2 and row[1].startswith("`hack/devtools/tests/`")
        for path in re.findall(r"`([\w/]+\.py)`", row[0])
        if (REPO / "hack" / "devtools" / "tests" / Path(path).name).exists()
    }


def test_the_paths_the_docs_name_exist() -> None:
    pattern = (
        r"(?<![\w./~-])((?:gangcheck|manifests|docs|tests|hack|config|kind|benchmarks)/[\w./*-]*\w)"
    )
    missing = []
    for doc in [*DOCS, *CHART_TEXT, REPO / "config" / "gangcheck.yaml"]:
        text = doc.read_text()
        moved = _moved(text)
        for path in set(re.findall(pattern, text)) - THEIR_PATHS - moved:
            if not (list(REPO.glob(path)) or list(REPO.glob(path + "*"))):
                missing.append(f"{doc.name}: {path}")
    assert missing == []


def test_the_python_files_and_names_the_docs_point_at_exist() -> None:
    """`x/y.py` (from the repository, gangcheck/ or hack/devtools/) is a file, and a name
    quoted right after it (`x/y.py` `name`) is a function, class or constant of that file."""
    bases = [REPO, REPO / "gangcheck", REPO / "hack" / "devtools"]
    wrong = []
    for doc in [*DOCS, REPO / "docs" / "benchmarks.md"]:
        text = doc.read_text()
        moved = _moved(text)
        for path, name in re.findall(r"`((?:[\w.-]+/)+[\w-]+\.py)`(?: `([\w.]+)`)?", text):
            found = [base / path for base in bases if (base / path).is_file()]
            if not found:
                if path not in moved:
                    wrong.append(f"{doc.name}: {path}")
                continue
            last = re.escape(name.split(".")[-1])
            defined = rf"^\s*(?:async )?(?:def|class) {last}\b|^{last}\s*[:=]"
            if name and not re.search(defined, found[0].read_text(), re.M):
                wrong.append(f"{doc.name}: {path} {name}")
    assert wrong == []


def test_the_tests_the_docs_name_exist() -> None:
    """A test the docs name (`test_x`, or a prefix of it cut with `...`) is a test function of
    the repository's tests, the dev tooling's or the benchmarks'."""
    defined: set[str] = set()
    for folder in ("tests", "hack/devtools/tests", "benchmarks"):
        for path in (REPO / folder).rglob("*.py"):
            defined |= set(re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), re.M))
    unknown = []
    for doc in [*DOCS, REPO / "docs" / "benchmarks.md"]:
        # a file (test_x.py, test_bench*.py) is the paths' test's
        named = re.findall(
            r"(?<![\w/.])(test_\w+)(\.\.\.|…)?(?![\w.*]*\.py)(?!\*)", doc.read_text()
        )
        for name, cut in set(named):
            if cut or name.endswith("_"):
                if not any(test.startswith(name.rstrip("_")) for test in defined):
                    unknown.append(f"{doc.name}: {name}...")
            elif name not in defined:
                unknown.append(f"{doc.name}: {name}")
    assert unknown == []
    assert len(defined) > 1000


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_links_between_the_docs_resolve() -> None:
    broken = []
    for doc in [*DOCS, REPO / "docs" / "benchmarks.md"]:
        for target in re.findall(r"\]\(([^)]+)\)", doc.read_text()):
            if target.startswith("http"):
                continue
            path, _, anchor = target.partition("#")
            linked = doc.parent / path if path else doc
            if not linked.exists():
                broken.append(f"{doc.name}: {target}")
            elif anchor:
                headings = re.findall(r"^#+ (.*)$", linked.read_text(), re.M)
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{doc.name}: {target}")
    assert broken == []


def test_the_annotations_and_labels_the_docs_name_are_the_codes() -> None:
    """gangcheck.io/ keys, and the taints gangcheck puts under cluster-autoscaler's prefix."""
    unknown = []
    for doc in [*DOCS, *CHART_TEXT, REPO / "config" / "gangcheck.yaml"]:
        source = _source_of(doc)
        text = doc.read_text()
        keys = set(re.findall(r"(?<![\w.-])gangcheck\.io/[a-z0-9-]*[a-z0-9]", text)) | set(
            re.findall(r"\b[a-z0-9.-]+\.[a-z]+/gangcheck-[a-z0-9-]*[a-z0-9]", text)
        )
        for key in keys - {"gangcheck.io/v1alpha1"}:  # the API version
            if f'"{key}"' not in source:
                unknown.append(f"{doc.name}: {key}")
    assert unknown == []


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


def test_no_doc_names_a_path_of_the_machine_it_was_written_on() -> None:
    """The docs name the project's paths, the user's (~/...) and the images' (/tmp, /etc of a
    container), never a checkout's absolute place or a home folder of someone's."""
    named = []
    for doc in [*DOCS, REPO / "docs" / "benchmarks.md", *CHART_TEXT]:
        for found in re.findall(r"(?<![\w.~-])/(?:work|home|Users|root)/[\w./-]*", doc.read_text()):
            named.append(f"{doc.name}: {found}")
    assert named == []
