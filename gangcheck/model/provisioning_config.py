"""The AtomicProvisioningConfig spec (gangcheck.io/v1alpha1), validated again in Python.

The CRD schema validates and defaults on the server; this model is the second line, so that a
config written before a schema change, or one the schema cannot express, is reported on the
AdmissionCheck's Active condition instead of breaking reconciles.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    model_validator,
)

BEST_EFFORT_ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
CHECK_CAPACITY = "check-capacity.autoscaling.x-k8s.io"
QUEUED_PROVISIONING = "queued-provisioning.gke.io"
#: The class gangcheck serves itself with Karpenter NodeClaims (spec.backend: Karpenter).
KARPENTER_CLASS = "karpenter.gangcheck.io"
#: The request parameter carrying spec.karpenter.nodePools, comma-separated.
NODE_POOLS_PARAMETER = "nodePools"
KNOWN_CLASSES = frozenset({BEST_EFFORT_ATOMIC, CHECK_CAPACITY, QUEUED_PROVISIONING})

MAX_PARAMETERS = 100
MAX_PARAMETER_LENGTH = 255
INT32_MAX = 2**31 - 1
"""The most an integer field holds: the CRD says int32, which an API server without
kube-openapi's int32 check stores whatever its size (a deadline past year 9999 otherwise)."""


class MergePolicy(StrEnum):
    IDENTICAL_POD_TEMPLATES = "IdenticalPodTemplates"
    IDENTICAL_SCHEDULING_REQUIREMENTS = "IdenticalWorkloadSchedulingRequirements"


class FulfillmentMode(StrEnum):
    """When the check turns Ready: once the gang fits on real nodes, or on Provisioned=True."""

    FIT = "NodesFit"
    TRUST_PROVISIONED = "TrustProvisioned"


class Reclaimer(StrEnum):
    NONE = "None"
    DELETE_NODE = "DeleteNode"
    DELETE_NODE_CLAIM = "DeleteNodeClaim"
    CAPI_MACHINE = "DeleteMachine"
    CORDON = "CordonAndTaint"


class Backend(StrEnum):
    """How capacity is asked for (docs/karpenter.md for the second)."""

    PROVISIONING_REQUEST = "ProvisioningRequest"
    KARPENTER = "Karpenter"


#: Reclaimers that give a Karpenter node back (CordonAndTaint waits for cluster-autoscaler).
KARPENTER_RECLAIMERS = frozenset({"DeleteNodeClaim", "DeleteNode", "None"})


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class RetryStrategy(_Spec):
    backoff_limit_count: Annotated[int, Field(alias="backoffLimitCount", ge=0, le=INT32_MAX)] = 3
    backoff_base_seconds: Annotated[int, Field(alias="backoffBaseSeconds", ge=1, le=INT32_MAX)] = 60
    backoff_max_seconds: Annotated[int, Field(alias="backoffMaxSeconds", ge=1, le=INT32_MAX)] = 1800

    @model_validator(mode="after")
    def _max_not_below_base(self) -> RetryStrategy:
        if self.backoff_max_seconds < self.backoff_base_seconds:
            raise ValueError("backoffMaxSeconds must not be below backoffBaseSeconds")
        return self


FINISHING = "finishing"
"""The validation context of a record read to finish its attempt (`recorded_spec`): the
checks of the labels gangcheck writes (`_label_key`, `_node_labels`, `_pool_name`) are not
applied."""


def _finishing(info: ValidationInfo) -> bool:
    return isinstance(info.context, dict) and bool(info.context.get(FINISHING))


def _label_key(key: str, info: ValidationInfo) -> str:
    """`key`, if it is a label key (gangcheck writes it as one); else ValueError."""
    problem = None if _finishing(info) else label_key_problem(key)
    if problem is not None:
        raise ValueError(problem)
    return key


def _node_labels(labels: dict[str, str], info: ValidationInfo) -> dict[str, str]:
    """`labels`, if each is a label Kubernetes takes (gangcheck writes them as a pod's
    nodeSelector); else ValueError naming the first that is not."""
    for key, value in () if _finishing(info) else labels.items():
        problem = label_key_problem(key) or label_value_problem(value)
        if problem is not None:
            raise ValueError(problem)
    return labels


def _pool_name(name: str, info: ValidationInfo) -> str:
    """`name`, if it can name a NodePool (a DNS subdomain: the pools join a comma-separated
    request parameter); else ValueError."""
    if _finishing(info):
        return name
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise ValueError(f"{name!r} is not a NodePool name (a DNS subdomain: a-z, 0-9, '-', '.')")
    return name


class NodeSelectorFromDetail(_Spec):
    key: Annotated[str, Field(min_length=1, max_length=317), AfterValidator(_label_key)]
    value_from_provisioning_class_detail: Annotated[
        str, Field(alias="valueFromProvisioningClassDetail", min_length=1, max_length=32768)
    ]


class PodSetUpdatesSpec(_Spec):
    node_selector: Annotated[
        tuple[NodeSelectorFromDetail, ...], Field(alias="nodeSelector", max_length=8)
    ] = ()


class Fulfillment(_Spec):
    mode: FulfillmentMode = FulfillmentMode.FIT
    deadline_seconds: Annotated[int, Field(alias="deadlineSeconds", ge=1, le=INT32_MAX)] = 420
    start_deadline_seconds: Annotated[
        int, Field(alias="startDeadlineSeconds", ge=1, le=INT32_MAX)
    ] = 600
    reclaimer: Reclaimer = Reclaimer.CORDON


class ReservationSpec(_Spec):
    """Reservation-backed capacity: up to `nodes` nodes carrying all of `nodeLabels`."""

    name: Annotated[str, Field(min_length=1, max_length=63)]
    node_labels: Annotated[dict[str, str], Field(alias="nodeLabels", min_length=1)]
    nodes: Annotated[int, Field(ge=1, le=INT32_MAX)]


class KarpenterSpec(_Spec):
    """Where a gang's NodeClaims go: the first of ``nodePools`` able to take the whole gang."""

    node_pools: Annotated[
        tuple[Annotated[str, Field(min_length=1, max_length=253), AfterValidator(_pool_name)], ...],
        Field(alias="nodePools", min_length=1, max_length=16),
    ]


#: A label key's name part and a label value (empty allowed for a value): at most 63
#: characters, alphanumeric at both ends, dashes, underscores and dots between.
_LABEL_PART = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
MAX_SELECTOR_TERMS = 32


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a label key (an optional DNS-subdomain prefix and `/`, then a name
    of at most 63 characters), as Kubernetes validates one; None when it is."""
    prefix, _, name = key.rpartition("/")
    if "/" in prefix or (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))):
        return f"{key!r} has no valid prefix (a DNS subdomain, then '/')"
    if not name or len(name) > 63 or not _LABEL_PART.match(name):
        return (
            f"{key!r} is not a label key (a name of 1-63 alphanumerics, '-', '_', '.', "
            "alphanumeric at both ends)"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a label value (at most 63 characters, as a key's name, or empty)."""
    if len(value) > 63 or not _LABEL_PART.match(value):
        return f"{value!r} is not a label value (at most 63 alphanumerics, '-', '_', '.')"
    return None


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(_Spec):
    """One metav1.LabelSelectorRequirement: `key operator values`."""

    key: str
    operator: SelectorOperator
    values: Annotated[tuple[str, ...], Field(max_length=MAX_SELECTOR_TERMS)] = ()

    @model_validator(mode="after")
    def _valid(self) -> LabelSelectorRequirement:
        listed = self.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN)
        if listed and not self.values:
            raise ValueError(f"values: required with operator {self.operator.value}")
        if not listed and self.values:
            raise ValueError(f"values: not with operator {self.operator.value}")
        problem = label_key_problem(self.key)
        if problem is None:
            problem = next(filter(None, map(label_value_problem, self.values)), None)
        if problem is not None:
            raise ValueError(problem)
        return self


class LabelSelector(_Spec):
    """A metav1.LabelSelector: every matchLabels pair and every matchExpressions requirement
    must hold; an empty one selects everything."""

    match_labels: Annotated[
        dict[str, str], Field(alias="matchLabels", max_length=MAX_SELECTOR_TERMS)
    ] = Field(default_factory=dict)
    match_expressions: Annotated[
        tuple[LabelSelectorRequirement, ...],
        Field(alias="matchExpressions", max_length=MAX_SELECTOR_TERMS),
    ] = ()

    @model_validator(mode="after")
    def _valid_labels(self) -> LabelSelector:
        for key, value in self.match_labels.items():
            problem = label_key_problem(key) or label_value_problem(value)
            if problem is not None:
                raise ValueError(f"matchLabels: {problem}")
        return self


class PodGroupsSpec(_Spec):
    """What the config allows PodGroups (Kueue Workloads are governed by their ClusterQueue
    and the AdmissionCheck the admin chose)."""

    namespace_selector: Annotated[LabelSelector | None, Field(alias="namespaceSelector")] = None
    """The namespaces whose PodGroups may use the config. Unset: every namespace (the
    configs made before the field keep serving the namespaces they served); `{}` too, as
    Kueue's ClusterQueue reads it."""


#: The most capacity sources a config lists (naming.MAX_SOURCES: as many names per attempt).
MAX_SOURCES = 8


class SourcePolicy(StrEnum):
    """How an attempt uses its capacity sources (docs/configure.md)."""

    IN_ORDER = "InOrder"
    """Ask the first; on its failure (or past its deadline) the next, in the same attempt."""
    RACE = "Race"
    """Ask the first `raceWidth` at once; the first to deliver the whole gang wins, the others
    are withdrawn and what arrived for them reclaimed; a failed racer's place goes to the
    next source not asked yet."""


class CapacitySource(_Spec):
    """One place to ask for a gang's capacity: a ProvisioningRequest class with its
    parameters, or Karpenter NodePools; `nodeSelector` pins the ask (the request's pod
    templates) and the gang (its podSetUpdates) to this source's nodes."""

    name: Annotated[str | None, Field(min_length=1, max_length=63)] = None
    provisioning_class_name: Annotated[
        str | None, Field(alias="provisioningClassName", min_length=1, max_length=253)
    ] = None
    parameters: Annotated[dict[str, str], Field(max_length=MAX_PARAMETERS)] = Field(
        default_factory=dict
    )
    karpenter: KarpenterSpec | None = None
    node_selector: Annotated[
        dict[str, str], Field(alias="nodeSelector", max_length=16), AfterValidator(_node_labels)
    ] = Field(default_factory=dict)
    deadline_seconds: Annotated[int | None, Field(alias="deadlineSeconds", ge=1, le=INT32_MAX)] = (
        None
    )


@dataclass(frozen=True)
class Source:
    """A capacity source as an attempt asks it: resolved from the config (`sources`)."""

    index: int
    name: str
    class_name: str
    parameters: Mapping[str, str]
    node_selector: Mapping[str, str]
    deadline_seconds: int

    @property
    def karpenter(self) -> bool:
        return self.class_name == KARPENTER_CLASS


class AtomicProvisioningSpec(_Spec):
    provisioning_class_name: Annotated[
        str, Field(alias="provisioningClassName", min_length=1, max_length=253)
    ] = BEST_EFFORT_ATOMIC
    allow_custom_provisioning_class: Annotated[
        bool, Field(alias="allowCustomProvisioningClass")
    ] = False
    parameters: Annotated[dict[str, str], Field(max_length=MAX_PARAMETERS)] = Field(
        default_factory=dict
    )
    managed_resources: Annotated[
        tuple[str, ...], Field(alias="managedResources", max_length=100)
    ] = ()
    pod_set_merge_policy: Annotated[MergePolicy | None, Field(alias="podSetMergePolicy")] = None
    retry_strategy: Annotated[RetryStrategy, Field(alias="retryStrategy")] = RetryStrategy()
    pod_set_updates: Annotated[PodSetUpdatesSpec | None, Field(alias="podSetUpdates")] = None
    fulfillment: Fulfillment = Fulfillment()
    reservations: Annotated[tuple[ReservationSpec, ...], Field(max_length=16)] = ()
    backend: Backend = Backend.PROVISIONING_REQUEST
    karpenter: KarpenterSpec | None = None
    capacity_sources: Annotated[
        tuple[CapacitySource, ...] | None, Field(alias="capacitySources", max_length=MAX_SOURCES)
    ] = None
    capacity_source_policy: Annotated[SourcePolicy, Field(alias="capacitySourcePolicy")] = (
        SourcePolicy.IN_ORDER
    )
    race_width: Annotated[int | None, Field(alias="raceWidth", ge=2, le=MAX_SOURCES)] = None
    pod_groups: Annotated[PodGroupsSpec, Field(alias="podGroups")] = PodGroupsSpec()

    @property
    def racing(self) -> int:
        """How many sources an attempt asks at once: 1 unless the policy is Race."""
        if self.capacity_source_policy is not SourcePolicy.RACE:
            return 1
        return self.race_width or 2

    def _race_rules(self) -> None:
        """Race needs as many sources as it asks at once, each telling its nodes apart."""
        assert self.capacity_sources is not None
        race = self.capacity_source_policy is SourcePolicy.RACE
        if self.race_width is not None and not race:
            raise ValueError("spec.raceWidth: only with spec.capacitySourcePolicy: Race")
        if not race:
            return
        sources = self.capacity_sources
        if len(sources) < 2:
            raise ValueError(
                f"spec.capacitySourcePolicy: Race asks at least two sources at once, but "
                f"spec.capacitySources lists {len(sources)} (use InOrder for one)"
            )
        if self.racing > len(sources):
            raise ValueError(
                f"spec.raceWidth: {self.racing} sources at once, but spec.capacitySources "
                f"lists {len(sources)}"
            )
        for i, source in enumerate(sources):
            if not source.node_selector:
                raise ValueError(
                    f"spec.capacitySources[{i}].nodeSelector: Race needs each source's node "
                    "labels, to tell whose nodes arrived"
                )
            for j in range(i):
                if not _apart(source.node_selector, sources[j].node_selector):
                    raise ValueError(
                        f"spec.capacitySources[{i}].nodeSelector: its nodes cannot be told "
                        f"apart from spec.capacitySources[{j}]'s (no label both name with "
                        "different values)"
                    )

    def sources(self) -> tuple[Source, ...]:
        """The places an attempt asks, in order: `capacitySources`, or the single class the
        top-level fields name (a list of one)."""
        deadline = self.fulfillment.deadline_seconds
        if self.capacity_sources is None:
            single = Source(
                0, "default", self.provisioning_class_name, self.parameters, {}, deadline
            )
            return (single,)
        return tuple(
            Source(
                i,
                s.name or f"source-{i}",
                _source_class(s),
                _source_parameters(s),
                s.node_selector,
                s.deadline_seconds or deadline,
            )
            for i, s in enumerate(self.capacity_sources)
        )

    def source(self, index: int) -> Source | None:
        found = self.sources()
        return found[index] if 0 <= index < len(found) else None

    def for_source(self, index: int) -> AtomicProvisioningSpec:
        """The config as an attempt asking source `index` follows it: with that source's
        deadline (the config as it is when there is no such source)."""
        source = self.source(index)
        if source is None or source.deadline_seconds == self.fulfillment.deadline_seconds:
            return self
        fulfillment = self.fulfillment.model_copy(
            update={"deadline_seconds": source.deadline_seconds}
        )
        return self.model_copy(update={"fulfillment": fulfillment})

    @model_validator(mode="after")
    def _capacity_sources(self) -> AtomicProvisioningSpec:
        if self.capacity_sources is None:
            if self.capacity_source_policy is SourcePolicy.RACE or self.race_width is not None:
                raise ValueError(
                    "spec.capacitySourcePolicy: Race needs spec.capacitySources to race"
                )
            return self
        if not self.capacity_sources:
            raise ValueError("spec.capacitySources: list at least one source, or leave it unset")
        # the API server defaults the single-class fields: only a value other than the
        # default says they were set
        set_too = [
            alias
            for alias, changed in (
                ("provisioningClassName", self.provisioning_class_name != BEST_EFFORT_ATOMIC),
                ("parameters", bool(self.parameters)),
                ("backend", self.backend is not Backend.PROVISIONING_REQUEST),
                ("karpenter", self.karpenter is not None),
            )
            if changed
        ]
        if set_too:
            raise ValueError(
                f"spec.{set_too[0]}: not with spec.capacitySources (each source names its "
                "own class and parameters)"
            )
        self._race_rules()
        names: set[str] = set()
        for i, source in enumerate(self.capacity_sources):
            where = f"spec.capacitySources[{i}]"
            _check_source(source, where, self.allow_custom_provisioning_class)
            name = source.name or f"source-{i}"
            if name in names:
                raise ValueError(f"{where}.name: {name!r} names an earlier source too")
            names.add(name)
            if source.karpenter and self.fulfillment.reclaimer.value not in KARPENTER_RECLAIMERS:
                raise ValueError(
                    f"spec.fulfillment.reclaimer: {self.fulfillment.reclaimer.value} waits for "
                    f"cluster-autoscaler's scale-down; {where} is Karpenter: use "
                    "DeleteNodeClaim or DeleteNode"
                )
        return self

    @model_validator(mode="before")
    @classmethod
    def _karpenter_class(cls, data: object) -> object:
        """With the Karpenter backend the attempt's request has gangcheck's own class, and the
        NodePools as a parameter (the request is the attempt's record; docs/karpenter.md)."""
        if not isinstance(data, dict) or data.get("backend") != Backend.KARPENTER.value:
            return data
        chosen = data.get("provisioningClassName", BEST_EFFORT_ATOMIC)
        if chosen not in (BEST_EFFORT_ATOMIC, KARPENTER_CLASS):
            raise ValueError(
                f"spec.provisioningClassName: {chosen!r} is not used with spec.backend "
                "Karpenter (gangcheck serves the attempt's request itself); leave it unset"
            )
        pools = (
            (data.get("karpenter") or {}).get("nodePools")
            if isinstance(data.get("karpenter"), dict)
            else None
        )
        parameters = dict(data.get("parameters") or {})
        if isinstance(pools, list):
            parameters[NODE_POOLS_PARAMETER] = ",".join(str(p) for p in pools)
        return {**data, "provisioningClassName": KARPENTER_CLASS, "parameters": parameters}

    @model_validator(mode="after")
    def _backend_parameters(self) -> AtomicProvisioningSpec:
        karpenter = self.backend is Backend.KARPENTER
        if karpenter and self.karpenter is None:
            raise ValueError("spec.karpenter: required when spec.backend is Karpenter")
        if not karpenter and self.karpenter is not None:
            raise ValueError("spec.karpenter: only with spec.backend: Karpenter")
        if karpenter and self.fulfillment.reclaimer.value not in KARPENTER_RECLAIMERS:
            raise ValueError(
                f"spec.fulfillment.reclaimer: {self.fulfillment.reclaimer.value} waits for "
                "cluster-autoscaler's scale-down; with spec.backend Karpenter use "
                "DeleteNodeClaim"
            )
        return self

    @model_validator(mode="after")
    def _known_class(self) -> AtomicProvisioningSpec:
        if self.provisioning_class_name == KARPENTER_CLASS:
            if self.backend is not Backend.KARPENTER:
                raise ValueError(
                    f"spec.provisioningClassName: {KARPENTER_CLASS!r} is served by gangcheck's "
                    "Karpenter backend only: set spec.backend: Karpenter"
                )
        elif (
            self.provisioning_class_name not in KNOWN_CLASSES
            and not self.allow_custom_provisioning_class
        ):
            raise ValueError(
                f"spec.provisioningClassName: {self.provisioning_class_name!r} is not a class any "
                "known autoscaler serves (cluster-autoscaler ignores unknown classes silently); "
                "set allowCustomProvisioningClass: true if a custom provisioner serves it"
            )
        for key, value in self.parameters.items():
            if len(value) > MAX_PARAMETER_LENGTH:
                raise ValueError(
                    f"spec.parameters: {key!r} is longer than {MAX_PARAMETER_LENGTH} characters"
                )
        return self


def _apart(one: Mapping[str, str], other: Mapping[str, str]) -> bool:
    """Whether no node can carry both selectors: a label both name, with different values."""
    return any(key in other and other[key] != value for key, value in one.items())


def _source_class(source: CapacitySource) -> str:
    if source.karpenter is not None:
        return KARPENTER_CLASS
    return source.provisioning_class_name or BEST_EFFORT_ATOMIC


def _source_parameters(source: CapacitySource) -> dict[str, str]:
    if source.karpenter is None:
        return dict(source.parameters)
    return {**source.parameters, NODE_POOLS_PARAMETER: ",".join(source.karpenter.node_pools)}


def _check_source(source: CapacitySource, where: str, allow_custom: bool) -> None:
    """One source's class and parameters, by the rules of the single-class fields."""
    chosen = source.provisioning_class_name
    if source.karpenter is not None and chosen is not None:
        raise ValueError(
            f"{where}.provisioningClassName: not with {where}.karpenter (gangcheck serves a "
            "Karpenter source's request itself)"
        )
    if chosen == KARPENTER_CLASS:
        raise ValueError(
            f"{where}.provisioningClassName: {KARPENTER_CLASS!r} is served through "
            f"{where}.karpenter.nodePools"
        )
    if chosen is not None and chosen not in KNOWN_CLASSES and not allow_custom:
        raise ValueError(
            f"{where}.provisioningClassName: {chosen!r} is not a class any known autoscaler "
            "serves (cluster-autoscaler ignores unknown classes silently); set "
            "spec.allowCustomProvisioningClass: true if a custom provisioner serves it"
        )
    for key, value in _source_parameters(source).items():
        if len(value) > MAX_PARAMETER_LENGTH:
            raise ValueError(
                f"{where}.parameters: {key!r} is longer than {MAX_PARAMETER_LENGTH} characters"
            )


def spec_record(spec: AtomicProvisioningSpec) -> str:
    """The spec as an attempt records it: compact JSON by the API's field names, defaults
    left out (`recorded_spec` reads it back). `podGroups` is left out too: it says who may
    start an attempt, nothing an attempt needs to finish (and a record without it reads in a
    version that predates the field)."""
    return spec.model_dump_json(by_alias=True, exclude_defaults=True, exclude={"pod_groups"})


@lru_cache(maxsize=256)
def recorded_spec(raw: str | None, *, finishing: bool = False) -> AtomicProvisioningSpec | None:
    """The spec an attempt recorded (`spec_record`); None when there is none or it no longer
    validates (a record from an older version). Read once per record (the model is frozen):
    every decision on an attempt in flight reads its record several times.

    `finishing`: read to finish the attempt (its rollback, its withdrawal: which reclaimer
    gives its arrivals back), without the checks of the labels gangcheck writes (a NodePool
    name, a nodeSelector): a record made before those checks refused it is still what the
    attempt was made under, and finishing it writes none of them. Read without it, such a
    record drives nothing more until the config is fixed."""
    if not raw:
        return None
    try:
        return AtomicProvisioningSpec.model_validate_json(
            raw, context={FINISHING: True} if finishing else None
        )
    except ValidationError:
        return None


def parse_spec(spec: object) -> AtomicProvisioningSpec:
    """Validate a config's spec; raise ValueError with one readable line on bad input."""
    try:
        return AtomicProvisioningSpec.model_validate(spec or {})
    except ValidationError as e:
        raise ValueError(_one_line(e)) from e


def _one_line(err: ValidationError) -> str:
    parts = []
    for item in err.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in item["loc"])
        message = str(item["msg"]).removeprefix("Value error, ")
        parts.append(f"spec{where}: {message}" if where else message)
    return "; ".join(parts)
