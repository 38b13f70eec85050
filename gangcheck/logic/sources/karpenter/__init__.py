"""Karpenter as a capacity backend: the gang's NodeClaims gangcheck creates itself (pure).

``claims``: the NodeClaim bodies of an attempt and what their conditions say; ``pools``: which
NodePool can take the gang (its labels, requirements and remaining limits). See
docs/karpenter.md for why gangcheck creates NodeClaims rather than CapacityBuffers or static
NodePools.
"""
