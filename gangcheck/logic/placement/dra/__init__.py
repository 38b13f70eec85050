"""DRA devices (resource.k8s.io/v1) in the gang fit: what a member claims, what nodes offer.

A member whose pod spec names ResourceClaimTemplates fits on a node only when kube-scheduler
could allocate every one of its claims from the devices that node reaches. Inputs are raw API
dicts; `gangcheck.logic.placement.fit` asks `allocate` member by member, node by node.

The inventory (`build_inventory`) takes ResourceSlices, DeviceClasses and ResourceClaims:
- slices form pools (driver, pool name); only a pool's newest generation counts. A pool that
  misses some of its slices, or whose device names or counter references clash, offers no
  device (kube-scheduler allocates nothing from it, and a request for `All` devices fails on
  a node it reaches);
- a slice (or, with `perDeviceNodeSelection`, each device) reaches nodes by `nodeName`,
  `nodeSelector` or `allNodes`: a `NodeScope` that fit resolves against its NodeView;
- counter sets (`sharedCounters`, in slices of their own since 1.37) belong to the pool;
- the devices in `status.allocation` of ResourceClaims are in use: taken, or for a device
  that allows multiple allocations, its `consumedCapacity` spent (admin access takes none);
- `problems` lists what a caller may want to emit an Event about: drivers no DeviceClass
  names, pools being updated or invalid, class selectors not evaluable, malformed values.

Allocation (`allocate`) goes claim by claim in pod order, request by request in claim order,
device by device in kube-scheduler's order (pools by driver and name, slices by name, devices
as listed). It is greedy: a request takes the first devices that qualify; a `firstAvailable`
request takes the first subrequest that can be satisfied then; nothing is revisited, except
that a claim with `matchAttribute` constraints is tried once per value of the attributes on
the node. So it never reports an allocation that is not feasible, but may miss one that
kube-scheduler's search would find. A device qualifies for a request when:
- it is not in use (a device allowing multiple allocations: while its capacity lasts; one
  claim never takes a device twice);
- the class's CEL selectors, then the request's, are true for it;
- its NoSchedule and NoExecute taints are tolerated by the request;
- its capacity covers the request's `capacity.requests` (after the device's request policy,
  which also says what an allocation consumes when nothing is asked);
- its pool's counter sets still hold the counters it consumes (partitionable devices);
- the claim's `matchAttribute` / `distinctAttribute` constraints hold.
`allocationMode: All` takes every device of the node that matches (at least one), and fails
if any of them does not qualify. `adminAccess` requests need matching devices but take none.

CEL selectors: the subset `compile_selector` documents is evaluated with CEL's semantics for
errors (a missing attribute is an error; `false && error` is false, `true && error` an
error). An error on a device stops the allocation on that node, as it stops kube-scheduler.
An expression outside the subset is not evaluable: a member that needs it fits nowhere, and
the reason quotes it.

Not modelled: TaintRules, binding conditions, compatibility groups and partition types
of counters, derived attributes, list-valued attributes in selectors (they compare unequal),
DeviceClass `extendedResourceName`, node-allocatable resources of devices, claims a PodGroup
shares, the limit of 32 devices per claim. A named (shared) ResourceClaim counts only once
allocated: it takes nothing more and limits the member to the nodes its allocation allows.
"""

from gangcheck.logic.placement.dra.allocation import DeviceRoom, allocate, most_members
from gangcheck.logic.placement.dra.cel import Selector, compile_selector
from gangcheck.logic.placement.dra.claims import DraContext, claim_needs
from gangcheck.logic.placement.dra.inventory import build_inventory, with_claims
from gangcheck.logic.placement.dra.model import (
    ALL,
    EXACT_COUNT,
    AttributeValue,
    CelError,
    Claim,
    ClaimNeeds,
    Constraint,
    CounterSetId,
    Device,
    DeviceCapacity,
    DeviceClass,
    DeviceId,
    Inventory,
    NodeDevices,
    NodeScope,
    Pool,
    Problem,
    Quantity,
    Request,
    SharedClaim,
    Shortfall,
    Usage,
    Version,
)

__all__ = [
    "ALL",
    "EXACT_COUNT",
    "AttributeValue",
    "CelError",
    "Claim",
    "ClaimNeeds",
    "Constraint",
    "CounterSetId",
    "Device",
    "DeviceCapacity",
    "DeviceClass",
    "DeviceId",
    "DeviceRoom",
    "DraContext",
    "Inventory",
    "NodeDevices",
    "NodeScope",
    "Pool",
    "Problem",
    "Quantity",
    "Request",
    "Selector",
    "SharedClaim",
    "Shortfall",
    "Usage",
    "Version",
    "allocate",
    "build_inventory",
    "claim_needs",
    "compile_selector",
    "most_members",
    "with_claims",
]
