"""Capacity backends: how an attempt asks for capacity for its gang, follows it, withdraws it.

``backend.py`` is the seam (a Protocol); ``status.py`` the backend-neutral attempt status the
decisions read; ``provreq.py`` the ProvisioningRequest backend (cluster-autoscaler, Kueue's
API). A second backend (e.g. Karpenter NodeClaims) is one more module here, plus the edge
that applies its actions; the attempt core and the gang sources do not change.
"""
