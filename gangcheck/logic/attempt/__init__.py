"""One attempt at capacity for a gang, for any gang source.

``lifecycle`` is the attempt core (follow, roll back, retry or give up, withdraw); around it:
actions, the arrival ledger and fulfillment, the capacity hold, rollback, reclaim safety,
naming, backoff, what members ask of nodes (``demand``) and how an attempt is explained
(``explain``). How capacity is asked for is logic/sources/; the names written on objects are
in model/names.py.
"""
