"""The order in which waiting requests claim new nodes (logic/sources/waiting.py): older
first, by creationTimestamp (whole seconds), then within one second by when gangcheck made
them (``gangcheck.io/asked-at``, to the microsecond), then by key. Before the stamp, two
gangs' requests made in the same second were ordered by name: in the side-by-side benchmark
the younger (g1, first by name) claimed a node made for the older (g2) once Provisioned
itself, and each gang waited for a node of the other's."""

from __future__ import annotations

import pytest

from gangcheck.logic.sources.waiting import waiting_requests
from gangcheck.model.names import ASKED_AT_ANNOTATION

Obj = dict[str, object]


def request(name: str, created: str, asked_at: str | None = None) -> Obj:
    notes = {ASKED_AT_ANNOTATION: asked_at} if asked_at else {}
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "creationTimestamp": created,
            "annotations": notes,
        },
        "status": {"conditions": [{"type": "Provisioned", "status": "True"}]},
    }


SECOND = "2026-12-07T02:40:01Z"
ORDERS = {
    "the same second: by when gangcheck made them, not by name": (
        [
            request("job-g1-1", SECOND, "2026-12-07T02:40:01.800000Z"),
            request("job-g2-1", SECOND, "2026-12-07T02:40:01.270000Z"),
        ],
        ["ns/job-g2-1", "ns/job-g1-1"],
    ),
    "different seconds: the second decides, whatever the stamps": (
        [
            request("a", "2026-12-07T02:40:02Z", "2026-12-07T02:40:01.000001Z"),
            request("b", SECOND, "2026-12-07T02:40:01.999999Z"),
        ],
        ["ns/b", "ns/a"],
    ),
    "a request of an earlier release (no stamp) first in its second": (
        [
            request("a", SECOND, "2026-12-07T02:40:01.100000Z"),
            request("z", SECOND),
        ],
        ["ns/z", "ns/a"],
    ),
    "no stamps: by name, as before": (
        [request("b", SECOND), request("a", SECOND)],
        ["ns/a", "ns/b"],
    ),
}


@pytest.mark.parametrize(("requests", "order"), ORDERS.values(), ids=ORDERS.keys())
def test_waiting_requests_oldest_first(requests: list[Obj], order: list[str]) -> None:
    assert [key for key, _ in waiting_requests(requests)] == order
