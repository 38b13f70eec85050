"""What a diagnosis reports: the reports of a Workload, a PodGroup and `status`, and the
errors that say a target cannot be diagnosed."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gangcheck.kube.discovery import ServedPodGroups
from gangcheck.logic.attempt.explain import GangRow, Verdict
from gangcheck.logic.dispatch import DispatchRecord, WorkerRow
from gangcheck.logic.podgroups.gating import PodGroupRef
from gangcheck.logic.podgroups.group_diagnosis import GroupFacts
from gangcheck.logic.sources.karpenter.explain import NodeClaimFacts
from gangcheck.logic.workloads.diagnosis import Ended, Facts, Target
from gangcheck.model.objects import Obj


class DiagnoseError(Exception):
    """The target cannot be diagnosed: missing, not a gang, or a kind not served."""


class PodGroupMember(DiagnoseError):
    """The pod belongs to no Kueue Workload, but names a PodGroup: that is its gang."""

    def __init__(self, message: str, group: PodGroupRef) -> None:
        super().__init__(message)
        self.group = group


@dataclass(frozen=True)
class DiagnoseReport:
    target: Target
    facts: Facts
    verdict: Verdict
    now: datetime
    claims: NodeClaimFacts | None = None
    """The attempt's NodeClaims, when Karpenter serves its request."""
    dispatch: DispatchRecord | None = None
    """In a MultiKueue manager: gangcheck's dispatcher's record on the Workload, if any."""
    controller: str = ""
    """Why no gangcheck acts here (`fetch.controller_down`), or ''."""

    @property
    def workload(self) -> str:
        return f"{self.facts.namespace}/{self.facts.name}"


@dataclass(frozen=True)
class GroupReport:
    """The diagnosis of a PodGroup's gang (`via`: the pod the user named, if any)."""

    target: Target
    facts: GroupFacts
    verdict: Verdict
    now: datetime
    via: Target | None = None
    claims: NodeClaimFacts | None = None
    """The attempt's NodeClaims, when Karpenter serves its request."""
    controller: str = ""
    """Why no gangcheck acts here (`fetch.controller_down`), or ''."""
    earlier: tuple[Ended, ...] = ()
    """The attempts before the one in flight, as the group's Events tell
    (`earlier.group_attempts`)."""

    @property
    def group(self) -> str:
        return f"{self.facts.namespace}/{self.facts.name}"


Report = DiagnoseReport | GroupReport
PodGroups = tuple[ServedPodGroups, list[tuple[str, Obj]]]


@dataclass(frozen=True)
class StatusReport:
    namespace: str | None
    gangs: tuple[GangRow, ...]
    now: datetime
    workers: tuple[WorkerRow, ...] = ()
    """In a MultiKueue manager: its gangs per worker cluster (``dispatch.worker_rows``)."""
    controller: str = ""
    """Why no gangcheck acts here (`fetch.controller_down`), or ''."""
