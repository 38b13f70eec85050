"""Every name gangcheck writes on API objects, and the names of the APIs it speaks, in one place.

``gangcheck.io/*`` first (by the object they are written on), then Kueue's and the
ProvisioningRequest API's. Values only: what each means is said where it is decided.
"""

from __future__ import annotations

import re

# ---- gangcheck.io: on the objects made for an attempt (requests, PodTemplates) ----------
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gangcheck"
WORKLOAD_ANNOTATION = "gangcheck.io/workload"
WORKLOAD_UID_ANNOTATION = "gangcheck.io/workload-uid"
CHECK_ANNOTATION = "gangcheck.io/check"
GROUP_ANNOTATION = "gangcheck.io/pod-group"
"""On requests and templates: ``<short>/<name>`` of the PodGroup they were made for."""
GROUP_UID_ANNOTATION = "gangcheck.io/pod-group-uid"
ATTEMPT_ANNOTATION = "gangcheck.io/attempt"
DEADLINE_ANNOTATION = "gangcheck.io/fulfillment-deadline"
PHASE_ANNOTATION = "gangcheck.io/phase"
OUTCOME_ANNOTATION = "gangcheck.io/outcome"
ROLLBACK_REASON_ANNOTATION = "gangcheck.io/rollback-reason"
GANG_GONE_ANNOTATION = "gangcheck.io/gang-gone"
"""On a request kept open after its gang went (lifecycle.promise): when the orphan sweep first
kept it. Its gang claims last: no live gang waits for it, and it records no node a live
waiting gang could use."""
ROLLBACK_NODES_ANNOTATION = "gangcheck.io/rollback-nodes"
RESERVED_ANNOTATION = "gangcheck.io/reserved-members"
"""On a request: members of its gang placed on reserved capacity (not asked for)."""
GANG_MEMBERS_ANNOTATION = "gangcheck.io/gang-members"
"""On a request: the members its attempt was made for (those it asks capacity for and those
placed on reserved nodes); on a released group: the members released together."""
CONFIG_ANNOTATION = "gangcheck.io/provisioning-config"
"""On a PodGroup: the AtomicProvisioningConfig to use instead of the configured default (and
copied onto its requests, read if the group is gone)."""
ATTEMPT_CONFIG_ANNOTATION = "gangcheck.io/attempt-config"
"""On a request: the AtomicProvisioningConfig spec its attempt was made under (JSON, defaults
left out), so the attempt can be followed and rolled back as it was asked even when its
config is later deleted or made invalid."""
ASKED_AT_ANNOTATION = "gangcheck.io/asked-at"
"""On a request: when gangcheck created it, to the microsecond (its clock; written with the
create, no write more). creationTimestamp has whole seconds: requests made in the same second
are ordered by it for the arrival ledger (logic/sources/waiting.py), not by their names."""
SOURCE_ANNOTATION = "gangcheck.io/capacity-source"
"""On a request: the index (in spec.capacitySources) of the source its attempt asks; absent
for the first source."""
DOMAIN_ANNOTATION = "gangcheck.io/topology-domain"
"""On a request: ``<level>=<value>``, the topology domain its ask is scoped to."""
FLAVORS_ANNOTATION = "gangcheck.io/resource-flavors"
"""On a Workload's request: the resource flavors its quota reservation assigned when the
attempt asked (sorted, comma-separated; written with the create): what its source's refusal
is published for when the Workload goes before a reconcile saw the refusal (a MultiKueue
worker's copy removed as the dispatcher moves on), gangcheck restarted meanwhile or not."""
DOMAINS_TRIED_ANNOTATION = "gangcheck.io/domains-tried"
"""On a request: the domains of its capacity source asked before it in its attempt."""
RACED_ANNOTATION = "gangcheck.io/sources-raced"
"""On a request a Race asked in place of a racer that could not deliver: the capacity sources
its attempt had asked when it was made, its own too, as indexes in the config it records."""
RACED_ALL_ANNOTATION = "gangcheck.io/sources-raced-all"
"""On a racer still in the running when another could not deliver and no source was left to
ask in its place: the config then (as ATTEMPT_CONFIG_ANNOTATION records one), every capacity
source of which its race had asked. Written before the other racer's request is withdrawn."""
ROLLING_BACK = "RollingBack"
FULFILLED = "Fulfilled"
STARTED = "Started"
KEPT = "Kept"
"""Values of PHASE_ANNOTATION. Kept: the source stopped short and what arrived from it is kept
for the attempt, the next source asked for the rest (logic/attempt/topup.py)."""
KEPT_FROM_ANNOTATION = "gangcheck.io/kept-from"
"""On a request topping others up: the requests of its attempt whose arrivals it counts on."""
KEPT_MEMBERS_ANNOTATION = "gangcheck.io/kept-members"
"""On a request topping others up: the members placed on the kept nodes (not asked for)."""

# ---- gangcheck.io: on a PodGroup (its state, shown to people) ---------------------------
STATE_ANNOTATION = "gangcheck.io/state"
MESSAGE_ANNOTATION = "gangcheck.io/message"
REQUEST_ANNOTATION = "gangcheck.io/request"
NEXT_ATTEMPT_ANNOTATION = "gangcheck.io/next-attempt-at"
UNGATED_ANNOTATION = "gangcheck.io/ungated-members"
RELEASED_AT_ANNOTATION = "gangcheck.io/released-at"
"""On a released group: when its gang was released (RFC 3339), for the start watchdog; on a
growth's request, when the growth's members were released onto it, for its own."""
START_ROLLED_AT_ANNOTATION = "gangcheck.io/start-rolled-back-at"
"""On a growth's request: when its start watchdog began its rollback (RFC 3339), written with
the rollback's record; the next growth's backoff counts from it (`growth.next_due`)."""
MARKED_SINCE_ANNOTATION = "gangcheck.io/releases-marked-since"
"""On a released group: since when (RFC 3339) every member gangcheck releases carries
``RELEASED_BY_ANNOTATION``: written with the gang's release, or, for a group a version before
the mark released, at the first look of one that marks (``RELEASED_UNMARKED_ANNOTATION``)."""
RELEASED_UNMARKED_ANNOTATION = "gangcheck.io/released-unmarked"
"""On a group a version before ``RELEASED_BY_ANNOTATION`` released: the members whose gate was
lifted with no mark that still waited unbound when a version that marks first looked (the
earlier version's release onto room that exists, binding), by name: taken as released, never
as ungated by hand."""
RACE_WON_ANNOTATION = "gangcheck.io/race-won-by"
"""On a group released under capacitySourcePolicy Race: the capacity source that won."""
DOMAIN_ANNOTATION = "gangcheck.io/topology-domain"
"""On a released group: the domain its members were pinned to (``key=value``), for late ones."""

# ---- gangcheck.io: on pods and namespaces (the webhook's gate) --------------------------
GATE = "gangcheck.io/provisioning"
"""The scheduling gate the webhook adds and the controller lifts."""
OPT_IN_LABEL = "gangcheck.io/gang-provisioning"
"""Namespace label that opts a namespace in (the webhook's namespaceSelector)."""
GATED_AT = "gangcheck.io/gated-at"
"""Annotation the webhook sets on the pods it gates: when, in RFC 3339 (UTC, seconds)."""
RELEASED_BY_ANNOTATION = "gangcheck.io/released-by"
"""On a PodGroup's member: gangcheck lifted its gate, written in the same patch; the value is
the reason of the Event that said so (GangReleased, GangGrown, LateMembersReleased)."""

# ---- gangcheck.io: on nodes (the arrival ledger, reclaim) -------------------------------
ARRIVED_FOR = "gangcheck.io/arrived-for"
HOLD_AS = "gangcheck.io/hold-as"
"""On a request: the key (``namespace/name``) of the request whose hold its arrivals carry, when
not its own (a workload slice's: the hold the Job's pods tolerate, given by its first slice)."""
OPT_OUT_LABEL = "gangcheck.io/do-not-reclaim"
RECLAIM_WHEN_IDLE = "gangcheck.io/reclaim-when-idle"
"""On a Node: gangcheck owes it a reclaim decision (it is fenced, draining, or a failed reclaim
is being retried). Written with the fence, in the same patch, so a fence is always recorded;
cleared when the reclaim is done or the node is kept."""
RECLAIMED_AT = "gangcheck.io/reclaimed-at"
"""On a Node CordonAndTaint reclaimed (left cordoned and tainted for cluster-autoscaler's
scale-down, its fence label and RECLAIM_WHEN_IDLE taken off in the same write): when
(RFC 3339). Taken off when the node no longer carries gangcheck's taint (a person returned it
to service), and with any undoing of gangcheck's fence (reclaim.unfence_ops)."""
SCALE_DOWN_GUARD = "gangcheck.io/scale-down-disabled-for"
"""On a Node: gangcheck set cluster-autoscaler's ``scale-down-disabled`` on it, in the same
write, for this request (``namespace/name``) whose arrivals are kept for a top-up
(logic/attempt/scaledown.py); gangcheck removes that annotation only where this record is."""
RECLAIM_TAINT = "gangcheck.io/reclaiming"
FENCE_LABEL = RECLAIM_TAINT
"""On a fenced Node, with the value "true": the parameter of the fence policy
(manifests/base/fence-policy.yaml), under which kube-apiserver refuses every bind to it."""

# ---- gangcheck.io: on Cluster API objects (the Machine reclaimer) -----------------------
SCALED_DOWN_FOR = "gangcheck.io/scaled-down-for-machine"
"""On a MachineSet/MachineDeployment, the prefix of a key written in the same patch as each
decrement, one per Machine (``<prefix>-<Machine uid>``), so a retry after a lost answer sees it
was done, whatever other Machines of that owner were scaled down since; taken off once the
Machine says OWNER_SCALED_DOWN. Written alone (its value the Machine's uid) before: still read."""
OWNER_SCALED_DOWN = "gangcheck.io/owner-scaled-down"
"""On a Machine: its owner has been scaled down for it; never again (across restarts)."""

# ---- gangcheck.io: the API group and the AdmissionCheck controller ----------------------
CONFIG_GROUP = "gangcheck.io"
CONFIG_VERSION = "v1alpha1"
CONTROLLER_NAME = "gangcheck.io/atomic-provisioning"

# ---- Kueue ------------------------------------------------------------------------------
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
KUEUE_API_VERSION = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
KUEUE_PROVISIONING = "kueue.x-k8s.io/provisioning-request"
"""Kueue's built-in ProvisioningRequest check: its pods consume a request too."""
REQUIRED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-required-topology"
GANG_REQUIRED_TOPOLOGY_ANNOTATION = "gangcheck.io/podset-required-topology"
"""gangcheck's own form of Kueue's annotation, on a Job's pod template: the same level, read by
gangcheck alone, so Kueue (v0.17 refuses its own on a flavor without topology-aware
scheduling) admits the Job and gangcheck asks, checks and pins inside one domain."""
PROVREQ_ANNOTATION_PREFIX = "provreq.kueue.x-k8s.io/"
WORKLOAD_NAME_ANNOTATION = "kueue.x-k8s.io/workload"
PREBUILT_WORKLOAD_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

# ---- ProvisioningRequest (autoscaling.x-k8s.io) -----------------------------------------
PROVREQ_GROUP = "autoscaling.x-k8s.io"
PROVREQ_VERSION = "v1"
PROVREQ_API_VERSION = f"{PROVREQ_GROUP}/{PROVREQ_VERSION}"
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"


# ---- what a Kubernetes name may be -------------------------------------------------------
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_dns_label(value: str) -> bool:
    """A DNS label (RFC 1123, as a namespace's name is): lowercase letters, digits and '-',
    at most 63 characters, a letter or digit at each end."""
    return _DNS_LABEL.fullmatch(value) is not None


def is_dns_subdomain(value: str) -> bool:
    """A DNS subdomain (RFC 1123, as most objects' names are): labels joined by '.', at most
    253 characters."""
    return len(value) <= 253 and _DNS_SUBDOMAIN.fullmatch(value) is not None
