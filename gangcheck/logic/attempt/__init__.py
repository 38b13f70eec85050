"""One attempt at capacity for a gang.

Actions, the arrival ledger, fulfillment, the capacity hold, rollback, reclaim safety, naming
and backoff.
"""
