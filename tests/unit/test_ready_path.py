"""The benchmark's breakdown of Provisioned -> Ready from the audit log
(``benchmarks/ready_path.py``): each gang's path from the provisioner's status write to its
check's write, cut at gangcheck's Fulfilled mark; Kueue's check at its first Workload write."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from benchmarks import ready_path

GANGCHECK = "system:serviceaccount:gangcheck-system:gangcheck"
T0 = 1_800_000_000.0


def stamp(at: float) -> str:
    return datetime.fromtimestamp(T0 + at, UTC).isoformat().replace("+00:00", "Z")


def patch(
    sent: float,
    done: float,
    resource: str,
    name: str,
    side: str,
    *,
    user: str,
    agent: str = "python-aiohttp",
    sub: str | None = None,
    body: Any = None,
) -> dict[str, Any]:
    ref = {"resource": resource, "namespace": f"bench-{side}", "name": name}
    if sub:
        ref["subresource"] = sub
    return {
        "verb": "patch",
        "user": {"username": user},
        "userAgent": agent,
        "objectRef": ref,
        "responseStatus": {"code": 200},
        "requestReceivedTimestamp": stamp(sent),
        "stageTimestamp": stamp(done),
        "requestObject": body,
    }


def fulfilled() -> dict[str, Any]:
    return {"metadata": {"annotations": {"gangcheck.io/phase": "Fulfilled"}}}


def test_each_segment_of_a_gangs_path_is_timed_on_both_sides() -> None:
    events = [
        patch(0.0, 1.0, "provisioningrequests", "wl-bench-gangcheck-1", "gangcheck",
              user="admin", sub="status"),
        # a write of the Workload before Provisioned is not its check's
        patch(0.5, 0.6, "workloads", "wl", "gangcheck", user=GANGCHECK, sub="status"),
        patch(3.0, 3.5, "provisioningrequests", "wl-bench-gangcheck-1", "gangcheck",
              user=GANGCHECK, body=fulfilled()),
        patch(3.75, 4.0, "workloads", "wl", "gangcheck", user=GANGCHECK, sub="status"),
        patch(0.0, 2.0, "provisioningrequests", "wl-bench-kueue-1", "kueue", user="admin",
              sub="status"),
        patch(2.5, 3.0, "workloads", "wl", "kueue", user="admin", agent="kueue/v0.17.0",
              sub="status"),
        patch(5.0, 6.0, "workloads", "wl", "kueue", user="admin", agent="kueue/v0.17.0",
              sub="status"),
    ]  # fmt: skip
    result = ready_path.breakdown(events)
    ours = result["gangcheck"]
    assert ours["Provisioned written -> Fulfilled mark sent"] == pytest.approx((2.0, 2.0))
    assert ours["  Fulfilled mark round trip"] == pytest.approx((0.5, 0.5))
    assert ours["  mark answered -> check write sent"] == pytest.approx((0.25, 0.25))
    assert ours["  check write round trip"] == pytest.approx((0.25, 0.25))
    assert ours["Provisioned written -> check written"] == pytest.approx((3.0, 3.0))
    theirs = result["kueue"]
    assert theirs["Provisioned written -> Workload write sent"] == pytest.approx((0.5, 0.5))
    assert theirs["Provisioned written -> check written"] == pytest.approx((1.0, 1.0))
    assert "gangcheck (1 gangs)" in "\n".join(ready_path.lines(result))
