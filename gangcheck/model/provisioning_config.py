"""The AtomicProvisioningConfig spec (gangcheck.io/v1alpha1), validated again in Python.

The CRD schema validates and defaults on the server; this model is the second line, so that a
config written before a schema change, or one the schema cannot express, is reported on the
AdmissionCheck's Active condition instead of breaking reconciles.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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
    backoff_limit_count: Annotated[int, Field(alias="backoffLimitCount", ge=0)] = 3
    backoff_base_seconds: Annotated[int, Field(alias="backoffBaseSeconds", ge=1)] = 60
    backoff_max_seconds: Annotated[int, Field(alias="backoffMaxSeconds", ge=1)] = 1800

    @model_validator(mode="after")
    def _max_not_below_base(self) -> RetryStrategy:
        if self.backoff_max_seconds < self.backoff_base_seconds:
            raise ValueError("backoffMaxSeconds must not be below backoffBaseSeconds")
        return self


class NodeSelectorFromDetail(_Spec):
    key: Annotated[str, Field(min_length=1, max_length=317)]
    value_from_provisioning_class_detail: Annotated[
        str, Field(alias="valueFromProvisioningClassDetail", min_length=1, max_length=32768)
    ]


class PodSetUpdatesSpec(_Spec):
    node_selector: Annotated[
        tuple[NodeSelectorFromDetail, ...], Field(alias="nodeSelector", max_length=8)
    ] = ()


class Fulfillment(_Spec):
    mode: FulfillmentMode = FulfillmentMode.FIT
    deadline_seconds: Annotated[int, Field(alias="deadlineSeconds", ge=1)] = 420
    start_deadline_seconds: Annotated[int, Field(alias="startDeadlineSeconds", ge=1)] = 600
    reclaimer: Reclaimer = Reclaimer.CORDON


class ReservationSpec(_Spec):
    """Reservation-backed capacity: up to `nodes` nodes carrying all of `nodeLabels`."""

    name: Annotated[str, Field(min_length=1, max_length=63)]
    node_labels: Annotated[dict[str, str], Field(alias="nodeLabels", min_length=1)]
    nodes: Annotated[int, Field(ge=1)]


class KarpenterSpec(_Spec):
    """Where a gang's NodeClaims go: the first of ``nodePools`` able to take the whole gang."""

    node_pools: Annotated[
        tuple[Annotated[str, Field(min_length=1, max_length=253)], ...],
        Field(alias="nodePools", min_length=1, max_length=16),
    ]


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
                    f"provisioningClassName {KARPENTER_CLASS!r} is served by gangcheck's "
                    "Karpenter backend only: set spec.backend: Karpenter"
                )
        elif (
            self.provisioning_class_name not in KNOWN_CLASSES
            and not self.allow_custom_provisioning_class
        ):
            raise ValueError(
                f"provisioningClassName {self.provisioning_class_name!r} is not a class any known "
                "autoscaler serves (cluster-autoscaler ignores unknown classes silently); "
                "set allowCustomProvisioningClass: true if a custom provisioner serves it"
            )
        for key, value in self.parameters.items():
            if len(value) > MAX_PARAMETER_LENGTH:
                raise ValueError(
                    f"parameter {key!r} is longer than {MAX_PARAMETER_LENGTH} characters"
                )
        return self


def spec_record(spec: AtomicProvisioningSpec) -> str:
    """The spec as an attempt records it: compact JSON by the API's field names, defaults
    left out (`recorded_spec` reads it back)."""
    return spec.model_dump_json(by_alias=True, exclude_defaults=True)


def recorded_spec(raw: str | None) -> AtomicProvisioningSpec | None:
    """The spec an attempt recorded (`spec_record`); None when there is none or it no longer
    validates (a record from an older version)."""
    if not raw:
        return None
    try:
        return AtomicProvisioningSpec.model_validate_json(raw)
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
        where = ".".join(str(p) for p in item["loc"]) or "spec"
        parts.append(f"spec.{where}: {item['msg']}" if where != "spec" else item["msg"])
    return "; ".join(parts)
