"""The Kueue Workload gang source: pod sets, the check's config, decide, diagnosis."""
