"""The PodGroup gang source: membership and gating, decide, diagnosis."""
