"""The informers one controller process keeps, and the lookups reconcilers make on them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gangcheck.kube.client import Kube, Obj
from gangcheck.kube.informer import Informer, Store
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    ATOMIC_CONFIG,
    NODE,
    POD,
    POD_TEMPLATE,
    PROVISIONING_REQUEST,
    RESOURCE_FLAVOR,
    WORKLOAD,
)
from gangcheck.logic import checkconfig
from gangcheck.logic.actions import (
    CHECK_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    WORKLOAD_ANNOTATION,
)
from gangcheck.model.objects import Flavor, flavor_of

MANAGED = f"{MANAGED_BY_LABEL}={MANAGED_BY}"


@dataclass
class Caches:
    workloads: Informer
    admission_checks: Informer
    configs: Informer
    flavors: Informer
    requests: Informer
    templates: Informer
    nodes: Informer
    pods: Informer

    @classmethod
    def create(cls, kube: Kube, *, watch_timeout: int = 300) -> Caches:
        def informer(res: object, selector: str | None = None) -> Informer:
            return Informer(kube, res, label_selector=selector, watch_timeout=watch_timeout)  # type: ignore[arg-type]

        return cls(
            workloads=informer(WORKLOAD),
            admission_checks=informer(ADMISSION_CHECK),
            configs=informer(ATOMIC_CONFIG),
            flavors=informer(RESOURCE_FLAVOR),
            requests=informer(PROVISIONING_REQUEST, MANAGED),
            templates=informer(POD_TEMPLATE, MANAGED),
            nodes=informer(NODE),
            pods=informer(POD),
        )

    def all(self) -> list[Informer]:
        return [
            self.workloads,
            self.admission_checks,
            self.configs,
            self.flavors,
            self.requests,
            self.templates,
            self.nodes,
            self.pods,
        ]

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.all()))

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.all())

    # ---- lookups ---------------------------------------------------------------------

    def our_check_names(self) -> set[str]:
        return {
            ac["metadata"]["name"] for ac in self.admission_checks.store if checkconfig.is_ours(ac)
        }

    def resolve(self, check: str) -> checkconfig.Resolution:
        return checkconfig.resolve(self.admission_checks.store.get(check), self.configs.store.get)

    def flavors_by_name(self) -> dict[str, Flavor]:
        return {f["metadata"]["name"]: flavor_of(f) for f in self.flavors.store}

    def requests_of(self, namespace: str, workload: str) -> list[Obj]:
        return _of_workload(self.requests.store, namespace, workload)

    def templates_of(self, namespace: str, workload: str) -> list[Obj]:
        return _of_workload(self.templates.store, namespace, workload)


def _of_workload(store: Store, namespace: str, workload: str) -> list[Obj]:
    """The objects gangcheck made for a Workload (they name it in an annotation)."""
    return [
        o
        for o in store.in_namespace(namespace)
        if (o["metadata"].get("annotations") or {}).get(WORKLOAD_ANNOTATION) == workload
    ]


def check_of(obj: Obj) -> str:
    return str((obj["metadata"].get("annotations") or {}).get(CHECK_ANNOTATION, ""))
