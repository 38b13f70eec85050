"""Where the time between Provisioned and Ready goes, per gang, read from the kube-apiserver's
audit log of a ``kueue_scale.py`` run (``--keep`` keeps it): the provisioner's status write
that made the request Provisioned, then each check's writes until its check is Ready.

- gangcheck: Provisioned written -> its ``Fulfilled`` mark sent (the watch event reaching
  gangcheck, the Workload's wait in its queue, the decision), the mark's round trip, -> the
  check write sent, that write's round trip;
- Kueue's check: Provisioned written -> Kueue's first Workload status write for the gang sent
  (the same: watch, queue, reconcile), its round trip.

Times are the API server's own (``requestReceivedTimestamp``, ``stageTimestamp``), so the
segments add up to Provisioned written -> check written; the benchmark's table times the same
path from its watch (receive times), which adds the watch's delivery to it.

    python benchmarks/ready_path.py /tmp/kueue-scale-500-XXXX/audit/audit.log
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

Obj = dict[str, Any]
SIDES = ("gangcheck", "kueue")
GANGCHECK_USER_PREFIX = "system:serviceaccount:gangcheck-system:"
PHASE_ANNOTATION = "gangcheck.io/phase"

SEGMENTS = {
    "gangcheck": (
        ("Provisioned written -> Fulfilled mark sent", "provisioned", "mark_sent"),
        ("  Fulfilled mark round trip", "mark_sent", "mark_done"),
        ("  mark answered -> check write sent", "mark_done", "check_sent"),
        ("  check write round trip", "check_sent", "check_done"),
        ("Provisioned written -> check written", "provisioned", "check_done"),
    ),
    "kueue": (
        ("Provisioned written -> Workload write sent", "provisioned", "check_sent"),
        ("  Workload write round trip", "check_sent", "check_done"),
        ("Provisioned written -> check written", "provisioned", "check_done"),
    ),
}


def _time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Gang:
    """The milestones of one gang's path from Provisioned to Ready (API server times)."""

    side: str
    at: dict[str, float] = field(default_factory=dict)

    def mark(self, milestone: str, when: float | None) -> None:
        if when is not None and milestone not in self.at:
            self.at[milestone] = when


def side_of(namespace: str) -> str | None:
    return next((s for s in SIDES if namespace == f"bench-{s}"), None)


def workload_of(request: str, side: str) -> str:
    """The Workload a request is for: both checks name it ``<workload>-<check>-<attempt>``."""
    return request.rsplit(f"-bench-{side}-", 1)[0]


def is_fulfilled_mark(event: Obj) -> bool:
    body = event.get("requestObject")
    annotations = ((body or {}).get("metadata") or {}).get("annotations") or {}
    return isinstance(body, dict) and annotations.get(PHASE_ANNOTATION) == "Fulfilled"


def trace(events: Iterable[Obj]) -> dict[tuple[str, str], Gang]:
    """Each gang's milestones, by (side, Workload name)."""
    gangs: dict[tuple[str, str], Gang] = {}
    for event in sorted(events, key=lambda e: _time(e.get("requestReceivedTimestamp")) or 0.0):
        ref = event.get("objectRef") or {}
        side = side_of(ref.get("namespace", ""))
        if side is None or event.get("verb") != "patch":
            continue
        if (event.get("responseStatus") or {}).get("code", 200) >= 300:
            continue
        user = str((event.get("user") or {}).get("username", ""))
        agent = str(event.get("userAgent") or "").lower()
        sent = _time(event.get("requestReceivedTimestamp"))
        done = _time(event.get("stageTimestamp"))
        resource, sub = ref.get("resource"), ref.get("subresource")
        if resource == "provisioningrequests" and sub == "status" and "kueue" not in agent:
            if not user.startswith(GANGCHECK_USER_PREFIX):  # the provisioner's answer
                key = (side, workload_of(ref.get("name", ""), side))
                gangs.setdefault(key, Gang(side)).mark("provisioned", done)
            continue
        key = (side, ref.get("name", ""))
        if resource == "provisioningrequests" and user.startswith(GANGCHECK_USER_PREFIX):
            key = (side, workload_of(ref.get("name", ""), side))
            gang = gangs.get(key)
            if gang is not None and "provisioned" in gang.at and is_fulfilled_mark(event):
                gang.mark("mark_sent", sent)
                gang.mark("mark_done", done)
            continue
        if resource != "workloads" or sub != "status":
            continue
        gang = gangs.get(key)
        if gang is None or "provisioned" not in gang.at or sent is None:
            continue
        if sent < gang.at["provisioned"]:
            continue
        # gangcheck's check write follows its mark; Kueue's is its first after Provisioned
        ours = user.startswith(GANGCHECK_USER_PREFIX) and "mark_done" in gang.at
        if (side == "gangcheck" and ours) or (side == "kueue" and "kueue" in agent):
            gang.mark("check_sent", sent)
            gang.mark("check_done", done)
    return gangs


def quantiles(values: Sequence[float]) -> tuple[float, float]:
    ordered = sorted(values)
    if not ordered:
        return math.nan, math.nan
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return statistics.median(ordered), p99


def breakdown(events: Iterable[Obj]) -> dict[str, dict[str, tuple[float, float]]]:
    """p50 and p99 of each segment, by side (seconds), over the gangs that reached Ready."""
    gangs = trace(events)
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for side in SIDES:
        done = [g for g in gangs.values() if g.side == side and "check_done" in g.at]
        out[side] = {
            label: quantiles([g.at[b] - g.at[a] for g in done if a in g.at and b in g.at])
            for label, a, b in SEGMENTS[side]
        }
        out[side]["gangs traced"] = (float(len(done)), float(len(done)))
    return out


def lines(result: dict[str, dict[str, tuple[float, float]]]) -> list[str]:
    out = ["where Provisioned -> Ready goes (API server times, p50 / p99):"]
    for side in SIDES:
        name = "gangcheck" if side == "gangcheck" else "Kueue's check"
        traced = int(result[side].get("gangs traced", (0, 0))[0])
        out.append(f"  {name} ({traced} gangs)")
        for label, _, _ in SEGMENTS[side]:
            p50, p99 = result[side][label]
            out.append(f"    {label:44} {p50:8.3f} s {p99:8.3f} s")
    return out


def read_log(path: str) -> Iterator[Obj]:
    with open(path) as log:
        for line in log:
            with contextlib.suppress(ValueError):
                yield json.loads(line)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("audit_log", help="the audit.log of a kept kueue_scale.py run")
    args = parser.parse_args(argv)
    print("\n".join(lines(breakdown(read_log(args.audit_log)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
