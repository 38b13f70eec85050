"""The informers one controller process keeps, and the lookups reconcilers make on them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gangcheck.kube.client import Kube, Obj
from gangcheck.kube.informer import Informer, Store
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    ATOMIC_CONFIG,
    DEVICE_CLASS,
    NAMESPACE,
    NODE,
    POD,
    POD_TEMPLATE,
    PROVISIONING_REQUEST,
    RESOURCE_CLAIM,
    RESOURCE_CLAIM_TEMPLATE,
    RESOURCE_FLAVOR,
    RESOURCE_SLICE,
    WORKLOAD,
    Resource,
)
from gangcheck.logic.attempt import rollback
from gangcheck.logic.attempt.actions import (
    CHECK_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    WORKLOAD_ANNOTATION,
)
from gangcheck.logic.podgroups.gating import OPT_IN_LABEL, OPT_IN_VALUE, group_of
from gangcheck.logic.podgroups.podgroup import GROUP_ANNOTATION
from gangcheck.logic.workloads import checkconfig
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
    namespaces: Informer
    device_classes: Informer
    resource_slices: Informer
    resource_claims: Informer
    claim_templates: Informer
    pod_groups: dict[str, Informer] = field(default_factory=dict)
    """PodGroup informers by API group, for the PodGroup APIs the server serves (started and
    stopped as discovery finds them; not part of `all()`)."""

    @classmethod
    def create(cls, kube: Kube, *, watch_timeout: int = 300) -> Caches:
        def informer(
            res: Resource, selector: str | None = None, *, optional: bool = False
        ) -> Informer:
            return Informer(
                kube, res, label_selector=selector, watch_timeout=watch_timeout, optional=optional
            )

        # Optional: Kueue (a cluster may run only PodGroup gangs) and DRA (Kubernetes < 1.34,
        # or turned off): while not served, their caches are empty and everything else runs.
        return cls(
            workloads=informer(WORKLOAD, optional=True),
            admission_checks=informer(ADMISSION_CHECK, optional=True),
            configs=informer(ATOMIC_CONFIG),
            flavors=informer(RESOURCE_FLAVOR, optional=True),
            requests=informer(PROVISIONING_REQUEST, MANAGED),
            templates=informer(POD_TEMPLATE, MANAGED),
            nodes=informer(NODE),
            pods=informer(POD),
            namespaces=informer(NAMESPACE),
            device_classes=informer(DEVICE_CLASS, optional=True),
            resource_slices=informer(RESOURCE_SLICE, optional=True),
            resource_claims=informer(RESOURCE_CLAIM, optional=True),
            claim_templates=informer(RESOURCE_CLAIM_TEMPLATE, optional=True),
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
            self.namespaces,
            self.device_classes,
            self.resource_slices,
            self.resource_claims,
            self.claim_templates,
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

    def reclaimer_of(self, check: str) -> str:
        """The reclaimer the check's config names (the default when it cannot be read)."""
        return rollback.reclaimer_of(self.resolve(check).spec if check else None)

    def flavors_by_name(self) -> dict[str, Flavor]:
        return {f["metadata"]["name"]: flavor_of(f) for f in self.flavors.store}

    def requests_of(self, namespace: str, workload: str) -> list[Obj]:
        return _made_for(self.requests.store, namespace, workload)

    def templates_of(self, namespace: str, workload: str) -> list[Obj]:
        return _made_for(self.templates.store, namespace, workload)

    def requests_of_group(self, namespace: str, group_key: str) -> list[Obj]:
        return _made_for(self.requests.store, namespace, group_key, GROUP_ANNOTATION)

    def templates_of_group(self, namespace: str, group_key: str) -> list[Obj]:
        return _made_for(self.templates.store, namespace, group_key, GROUP_ANNOTATION)

    def members_of(self, namespace: str, api_group: str, name: str) -> list[Obj]:
        """Pods of the namespace that name this PodGroup."""
        return [
            p for p in self.pods.store.in_namespace(namespace) if group_of(p) == (api_group, name)
        ]

    def opted_in(self, namespace: str) -> bool:
        return self.opted_in_obj(self.namespaces.store.get(namespace) or {})

    @staticmethod
    def opted_in_obj(namespace: Obj) -> bool:
        labels = (namespace.get("metadata") or {}).get("labels") or {}
        return bool(labels.get(OPT_IN_LABEL) == OPT_IN_VALUE)


def _made_for(
    store: Store, namespace: str, owner: str, annotation: str = WORKLOAD_ANNOTATION
) -> list[Obj]:
    """The objects gangcheck made for a Workload or a PodGroup (named in an annotation)."""
    return [
        o
        for o in store.in_namespace(namespace)
        if (o["metadata"].get("annotations") or {}).get(annotation) == owner
    ]


def check_of(obj: Obj) -> str:
    return str((obj["metadata"].get("annotations") or {}).get(CHECK_ANNOTATION, ""))
