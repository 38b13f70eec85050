"""The fault suite's judge of a reclaim: a node deleted while an adversary's bind was in
flight is unsafe only when the bind landed first (by etcd revision), or when the order is
unknown."""

from __future__ import annotations

import pytest

from tests.faults.proxy import Write
from tests.faults.suite import Bind, Ledger, _ran_a_pod

DELETE = Write("replica-a", "DELETE", "/api/v1/nodes/n1", 200, sent=10.0, answered=11.0)


def _ledger(bind: Bind, *, deleted: int | None, bound: int | None) -> Ledger:
    ledger = Ledger(binds=[bind])
    if deleted is not None:
        ledger.revisions.deleted["n1"] = deleted
    if bound is not None:
        ledger.revisions.bound[bind.pod] = bound
    return ledger


@pytest.mark.parametrize(
    ("sent", "accepted", "deleted", "bound", "unsafe"),
    [
        # sent after the delete was answered: it landed on no node
        (12.0, True, 100, 120, False),
        # refused by the fence policy
        (10.5, False, 100, None, False),
        # in flight together, landed first: a pod was on the node when it was deleted
        (10.5, True, 100, 90, True),
        # in flight together, landed after the delete
        (10.5, True, 100, 110, False),
        # sent before the delete: landed first
        (9.0, True, 100, 80, True),
        # the watches missed a revision: judged unsafe, never guessed safe
        (10.5, True, None, 110, True),
        (10.5, True, 100, None, True),
    ],
)
def test_a_reclaim_is_unsafe_only_if_a_pod_landed_before_the_delete(
    sent: float, accepted: bool, deleted: int | None, bound: int | None, unsafe: bool
) -> None:
    bind = Bind("adversary-0", "n1", True, sent, sent + 0.1, accepted)
    ledger = _ledger(bind, deleted=deleted, bound=bound)
    assert _ran_a_pod("n1", [DELETE], ledger) is unsafe
