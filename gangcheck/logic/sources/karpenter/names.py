"""Karpenter's API names gangcheck reads and writes, and the ones gangcheck adds to claims."""

from __future__ import annotations

GROUP = "karpenter.sh"
API_VERSION = "karpenter.sh/v1"
NODE_POOL_KIND = "NodePool"
NODE_CLAIM_KIND = "NodeClaim"
#: On every NodeClaim (and its Node): the NodePool it belongs to; Karpenter's limits counter,
#: disruption and metrics key on it.
NODE_POOL_LABEL = "karpenter.sh/nodepool"
#: On a Node or NodeClaim: consolidation and drift leave it alone (not expiry, not repair).
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
#: On a gang's NodeClaims (and so their Nodes): the NodePool's template asks for
#: ``DO_NOT_DISRUPT`` itself, on every node of the pool; gangcheck then never takes it off.
POOL_PROTECTED = "gangcheck.io/pool-do-not-disrupt"
#: The NodePool's template hash, copied onto claims so that drift compares like Karpenter's own.
POOL_HASH = "karpenter.sh/nodepool-hash"
POOL_HASH_VERSION = "karpenter.sh/nodepool-hash-version"
#: The requirement (and node label) naming the machine a claim launches.
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
#: Labels Karpenter or the cloud provider set on every node whatever the NodePool says, so a
#: flavor may select on them without the pool defining them.
WELL_KNOWN_LABELS = frozenset(
    {
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        INSTANCE_TYPE_LABEL,
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "karpenter.sh/capacity-type",
        NODE_POOL_LABEL,
    }
)
#: On a gang's NodeClaims: the attempt they were created for (the hold value of its key).
ATTEMPT_LABEL = "gangcheck.io/attempt"
#: On a gang's NodeClaims: the attempt's key (``namespace/name``), its size and the claim's index.
REQUESTED_FOR = "gangcheck.io/requested-for"
GANG_NODES = "gangcheck.io/gang-nodes"
#: On a gang's NodeClaims: the uid of the request they were made for (a request made again
#: under the same name is another).
REQUEST_UID = "gangcheck.io/request-uid"
CLAIM_INDEX = "gangcheck.io/claim-index"
#: On a gang's NodeClaims: how many of the gang's members it is asked for.
CLAIM_MEMBERS = "gangcheck.io/claim-members"
#: On a NodePool: the instance types it launches and what one node of each offers to pods
#: (JSON), which gangcheck packs the gang's members by (``packing``).
INSTANCE_TYPES = "gangcheck.io/instance-types"
