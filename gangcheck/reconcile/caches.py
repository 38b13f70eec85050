"""The informers one controller process keeps, and the lookups reconcilers make on them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gangcheck.kube.client import Kube
from gangcheck.kube.informer import Index, Informer, Store, Transform, object_key
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    ATOMIC_CONFIG,
    DEVICE_CLASS,
    NAMESPACE,
    NODE,
    NODE_CLAIM,
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
from gangcheck.logic.attempt.fulfillment import Waiting
from gangcheck.logic.placement.dra import DraContext, Inventory
from gangcheck.logic.placement.usage import DeviceInventory, NodeUsage
from gangcheck.logic.podgroups.gating import OPT_IN_VALUE, group_of
from gangcheck.logic.sources import waiting
from gangcheck.logic.workloads import checkconfig
from gangcheck.model.names import (
    CHECK_ANNOTATION,
    CONSUME_ANNOTATION,
    GANG_GONE_ANNOTATION,
    GROUP_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    OPT_IN_LABEL,
    WORKLOAD_ANNOTATION,
)
from gangcheck.model.objects import Flavor, Obj, Pod, flavor_of, labels_of, pod_of
from gangcheck.model.provisioning_config import AtomicProvisioningSpec
from gangcheck.reconcile.ingest import trim_node, trim_pod

MANAGED = f"{MANAGED_BY_LABEL}={MANAGED_BY}"


def trim_node_claim(claim: Obj) -> Obj:
    """A NodeClaim as the capacity reads it: its name, whether it is being deleted, and the
    node it is (`status.nodeName`, `status.providerID`); not its spec or conditions."""
    meta, status = claim.get("metadata") or {}, claim.get("status") or {}
    kept = ("name", "uid", "resourceVersion", "deletionTimestamp")
    return {
        **{k: claim[k] for k in ("apiVersion", "kind") if k in claim},
        "metadata": {k: meta[k] for k in kept if k in meta},
        "status": {k: status[k] for k in ("nodeName", "providerID") if k in status},
    }


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
    node_claims: Informer
    """Karpenter's NodeClaims: a node whose claim is being deleted is going, never counted as
    capacity (fed to `capacity`). Optional, and a list refused (403) counts as none: without
    Karpenter, or without the right, the nodes are judged on themselves alone."""
    pod_groups: dict[str, Informer] = field(default_factory=dict)
    """PodGroup informers by API group, for the PodGroup APIs the server serves (started and
    stopped as discovery finds them; not part of `all()`)."""
    pod_groups_discovered: bool = False
    """Discovery has answered once and its PodGroup informers have synced, or been waited
    for long enough (`Controller._serve_pod_groups`): until then a PodGroup missing from
    `pod_groups` says nothing of what the server serves (`pod_groups_known`)."""
    capacity: NodeUsage = field(default_factory=lambda: NodeUsage(tally=CONSUME_ANNOTATION))
    """Node views and what bound pods use per node, kept current from node and pod events."""
    device_inventory: DeviceInventory = field(default_factory=DeviceInventory)
    """The DRA inventory, built again only when a slice, class or claim changed."""
    pod_views: dict[str, Pod] = field(default_factory=dict)
    """Every cached Pod's typed view by `namespace/name`, parsed once per pod event."""
    in_flight: InFlight = field(init=False)
    """The requests capacity may still arrive for, kept from request and template events."""
    made_requests: Index = field(init=False)
    """The requests made for each Workload or PodGroup (`made_for`)."""
    made_templates: Index = field(init=False)
    """The pod templates made for each Workload or PodGroup (`made_for`)."""
    members: Index = field(init=False)
    """The pods naming each PodGroup (`member_of`)."""

    def __post_init__(self) -> None:
        self.in_flight = InFlight(self.requests.store, self.templates.store)
        self.made_requests = Index(self.requests.store, made_for)
        self.made_templates = Index(self.templates.store, made_for)
        self.members = Index(self.pods.store, member_of)
        self.requests.store.add_indexer(self.in_flight.on_request)
        self.templates.store.add_indexer(self.in_flight.on_template)
        self.nodes.store.add_indexer(self.capacity.on_node)
        self.pods.store.add_indexer(self.capacity.on_pod)
        self.pods.store.add_indexer(self._on_pod)
        self.resource_slices.store.add_indexer(self.device_inventory.on_published)
        self.device_classes.store.add_indexer(self.device_inventory.on_published)
        self.resource_claims.store.add_indexer(self.device_inventory.on_claim)
        self.node_claims.store.add_indexer(self.capacity.on_node_claim)

    def _on_pod(self, old: Obj | None, new: Obj | None) -> None:
        if new is not None:
            view = pod_of(new)
            self.pod_views[view.ref.key] = view
        elif old is not None:
            self.pod_views.pop(object_key(old), None)

    def dra(self, namespace: str) -> tuple[DraContext, Inventory]:
        """A fit's DRA inputs: the namespace's claim templates and claims, and the devices."""
        context = DraContext.of(
            self.claim_templates.store.in_namespace(namespace),
            self.resource_claims.store.in_namespace(namespace),
        )
        inventory = self.device_inventory.inventory(
            self.resource_slices.store.values(),
            self.device_classes.store.values(),
            self.resource_claims.store.values(),
        )
        return context, inventory

    @classmethod
    def create(cls, kube: Kube, *, watch_timeout: int = 300) -> Caches:
        def informer(
            res: Resource,
            selector: str | None = None,
            *,
            optional: bool = False,
            transform: Transform | None = None,
            forbidden_is_absent: bool = False,
        ) -> Informer:
            return Informer(
                kube,
                res,
                label_selector=selector,
                watch_timeout=watch_timeout,
                optional=optional,
                transform=transform,
                forbidden_is_absent=forbidden_is_absent,
            )

        # Optional: Kueue (a cluster may run only PodGroup gangs) and DRA (Kubernetes < 1.34,
        # or turned off): while not served, their caches are empty and everything else runs.
        # Karpenter's NodeClaims as well, and also while their list is refused (an install
        # without the rule of manifests/base that reads them).
        return cls(
            workloads=informer(WORKLOAD, optional=True),
            admission_checks=informer(ADMISSION_CHECK, optional=True),
            configs=informer(ATOMIC_CONFIG),
            flavors=informer(RESOURCE_FLAVOR, optional=True),
            requests=informer(PROVISIONING_REQUEST, MANAGED),
            templates=informer(POD_TEMPLATE, MANAGED),
            nodes=informer(NODE, transform=trim_node),
            pods=informer(POD, transform=trim_pod),
            namespaces=informer(NAMESPACE),
            device_classes=informer(DEVICE_CLASS, optional=True),
            resource_slices=informer(RESOURCE_SLICE, optional=True),
            resource_claims=informer(RESOURCE_CLAIM, optional=True),
            claim_templates=informer(RESOURCE_CLAIM_TEMPLATE, optional=True),
            node_claims=informer(
                NODE_CLAIM, optional=True, transform=trim_node_claim, forbidden_is_absent=True
            ),
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
            self.node_claims,
        ]

    def deleted(
        self, res: Resource, name: str, namespace: str | None, answer: Obj | None, *, uid: str
    ) -> None:
        """A delete of gangcheck's own of `name` (at `uid`) succeeded, `answer` the API
        server's (None: a 404, gone already): the cache of `res` knows at once
        (`Store.deleted`: one gone is dropped, one its finalizers keep is there being
        deleted), not only once the watch brings the DELETED. A resource not cached here:
        nothing to tell."""
        for informer in self.all():
            if informer.resource == res:
                informer.store.deleted(name, namespace, answer, uid=uid or None)

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.all()))

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.all())

    @property
    def pod_groups_synced(self) -> bool:
        """Every PodGroup API served has listed (none is waiting on a list refused or failing)."""
        return all(i.synced.is_set() for i in self.pod_groups.values())

    def pod_groups_known(self, api_group: str) -> bool:
        """Whether a PodGroup of this API missing from the caches is known to be missing:
        discovery has answered, and the API is not served or its informer has listed. A
        served API whose list is refused or failing proves no group absent."""
        if not self.pod_groups_discovered:
            return False
        informer = self.pod_groups.get(api_group)
        return informer is None or informer.synced.is_set()

    # ---- lookups ---------------------------------------------------------------------

    def our_check_names(self) -> set[str]:
        return {
            ac["metadata"]["name"] for ac in self.admission_checks.store if checkconfig.is_ours(ac)
        }

    def resolve(self, check: str) -> checkconfig.Resolution:
        return checkconfig.resolve(self.admission_checks.store.get(check), self.configs.store.get)

    def config_of(self, check: str) -> AtomicProvisioningSpec | None:
        """The check's config, None when it cannot be read."""
        return self.resolve(check).spec if check else None

    def reclaimer_of(self, check: str) -> str:
        """The reclaimer the check's config names (the default when it cannot be read)."""
        return rollback.reclaimer_of(self.config_of(check))

    def flavors_by_name(self) -> dict[str, Flavor]:
        return {f["metadata"]["name"]: flavor_of(f) for f in self.flavors.store}

    def requests_of(self, namespace: str, workload: str) -> list[Obj]:
        return self.made_requests.of((WORKLOAD_ANNOTATION, namespace, workload))

    def templates_of(self, namespace: str, workload: str) -> list[Obj]:
        return self.made_templates.of((WORKLOAD_ANNOTATION, namespace, workload))

    def requests_of_group(self, namespace: str, group_key: str) -> list[Obj]:
        return self.made_requests.of((GROUP_ANNOTATION, namespace, group_key))

    def templates_of_group(self, namespace: str, group_key: str) -> list[Obj]:
        return self.made_templates.of((GROUP_ANNOTATION, namespace, group_key))

    def members_of(self, namespace: str, api_group: str, name: str) -> list[Obj]:
        """Pods of the namespace that name this PodGroup."""
        return self.members.of((namespace, api_group, name))

    def member_views(self, namespace: str, api_group: str, name: str) -> tuple[Pod, ...]:
        """The members (`members_of`) as the logic reads them."""
        views = []
        for pod in self.members_of(namespace, api_group, name):
            kept = self.pod_views.get(f"{namespace}/{pod['metadata']['name']}")
            views.append(kept if kept is not None and kept.raw is pod else pod_of(pod))
        return tuple(views)

    def opted_in(self, namespace: str) -> bool:
        return self.namespace_labels(namespace).get(OPT_IN_LABEL) == OPT_IN_VALUE

    def namespace_labels(self, namespace: str) -> dict[str, str]:
        """The namespace's labels; none while it is not cached (a selector then decides on
        none: it is read again once the namespace is, `Controller._on_namespace`)."""
        return labels_of(self.namespaces.store.get(namespace) or {})


class InFlight:
    """The open requests (capacity may still arrive for them: see logic/sources/waiting.py),
    kept from request events, and the waiting order worked out again only after a request or
    a template changed, not on every reconcile."""

    def __init__(self, requests: Store, templates: Store) -> None:
        self._requests = requests
        self._templates = templates
        self._open: dict[str, Obj] = {}
        self._waiting: tuple[Waiting, ...] | None = None
        self._open_order: tuple[Waiting, ...] | None = None

    def on_request(self, old: Obj | None, new: Obj | None) -> None:
        if old is not None:
            self._open.pop(waiting.request_key(old), None)
        if new is not None and waiting.is_open(new):
            self._open[waiting.request_key(new)] = new
        self._waiting = self._open_order = None

    def on_template(self, _old: Obj | None, _new: Obj | None) -> None:
        self._waiting = self._open_order = None

    def open_requests(self) -> list[Obj]:
        """The open requests, in no particular order."""
        return list(self._open.values())

    def gangs(self) -> int:
        """The Workloads and PodGroups with an open request (several sources asked at once
        count once; a gang running on what it was given, not at all; a request kept open
        after its gang went, GANG_GONE_ANNOTATION, neither: there is no gang)."""
        return len(
            {
                gang
                for req in self._open.values()
                if GANG_GONE_ANNOTATION not in (req["metadata"].get("annotations") or {})
                for gang in made_for(req)
            }
        )

    def waiting(self) -> tuple[Waiting, ...]:
        """The Provisioned open requests with their templates, oldest first."""
        if self._waiting is None:
            self._waiting = waiting.waiting_of(self._open.values(), self._templates.get)
        return self._waiting

    def open(self) -> tuple[Waiting, ...]:
        """Every open request with its templates, oldest first."""
        if self._open_order is None:
            self._open_order = waiting.waiting_of(
                self._open.values(), self._templates.get, is_waiting=waiting.is_open
            )
        return self._open_order


MADE_FOR_ANNOTATIONS = (WORKLOAD_ANNOTATION, GROUP_ANNOTATION)


def made_for(obj: Obj) -> list[tuple[str, str, str]]:
    """The Workloads and PodGroups gangcheck made the object for (named in its annotations):
    (annotation, namespace, the name it gives)."""
    meta = obj["metadata"]
    annotations = meta.get("annotations") or {}
    namespace = str(meta.get("namespace") or "")
    return [(a, namespace, str(annotations[a])) for a in MADE_FOR_ANNOTATIONS if a in annotations]


def member_of(pod: Obj) -> list[tuple[str, str, str]]:
    """The PodGroup the pod names, if any: (namespace, API group, name)."""
    ref = group_of(pod)
    return [] if ref is None else [(str(pod["metadata"].get("namespace") or ""), *ref)]


def check_of(obj: Obj) -> str:
    return str((obj["metadata"].get("annotations") or {}).get(CHECK_ANNOTATION, ""))
