"""Capacity backends: how an attempt asks for capacity for its gang, follows it, withdraws it.

The seam (a Protocol) is ``logic/attempt/backend.py`` and the backend-neutral attempt status
the decisions read ``logic/attempt/status.py``; here, the backends: ``provreq.py`` the
ProvisioningRequest backend (cluster-autoscaler, Kueue's API), ``karpenter/`` Karpenter's
NodeClaims, which gangcheck makes itself; ``waiting.py`` which requests wait for capacity and
in which order; ``world.py`` what a diagnosis reads live. Another backend is one more module
here, plus the edge that applies its actions; the attempt core and the gang sources do not
change.
"""
