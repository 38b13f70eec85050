"""The scale benchmark's reading of the audit log (``benchmarks/kueue_scale.py``): Events a
controller's recorder sends after the last admission are waited for and counted, apart too;
other requests are counted in the burst's window only; a record half written when the log is
read is read whole on the next read."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gangcheck_dev.testbed.certs import ADMIN_USER

from benchmarks import kueue_scale

NAMESPACES = {"gangcheck": "bench-gangcheck", "kueue": "bench-kueue"}


def record(at: float, verb: str, resource: str, *, kueue: bool, namespace: str) -> dict[str, Any]:
    user = ADMIN_USER if kueue else kueue_scale.GANGCHECK_USER
    agent = "kueue/v0.17.0" if kueue else "python-aiohttp"
    stamp = datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")
    return {
        "verb": verb,
        "user": {"username": user},
        "userAgent": agent,
        "objectRef": {"resource": resource, "namespace": namespace},
        "requestReceivedTimestamp": stamp,
        "requestObject": {"reason": "ProvisioningRequestCreated"} if resource == "events" else None,
    }


def test_events_after_the_window_count_until_they_settle_and_apart() -> None:
    kueue = NAMESPACES["kueue"]
    log = [
        record(10, "create", "events", kueue=True, namespace=kueue),
        record(11, "patch", "workloads", kueue=True, namespace=kueue),
        record(25, "create", "events", kueue=True, namespace=kueue),  # after the last admission
        record(26, "patch", "workloads", kueue=True, namespace=kueue),  # after: not counted
        record(99, "create", "events", kueue=True, namespace=kueue),  # after it settled
    ]
    audit = kueue_scale.count_requests(log, (0.0, 20.0), NAMESPACES, events_until=30.0)
    assert audit["detail"]["kueue_kueue"] == {"create events": 2, "patch workloads": 1}
    assert audit["after_window"] == {"kueue_kueue create events": 1}
    assert audit["event_reasons"]["kueue_kueue"] == {"ProvisioningRequestCreated": 2}

    within = kueue_scale.count_requests(log, (0.0, 20.0), NAMESPACES)
    assert within["detail"]["kueue_kueue"] == {"create events": 1, "patch workloads": 1}
    assert within["after_window"] == {}


def test_phase_records_after_the_window_count_until_events_settle_other_patches_do_not() -> None:
    """gangcheck marks a request Started once its gang's pods are bound, so the last gangs'
    marks come after the last admission: counted as Events are."""
    ours = NAMESPACES["gangcheck"]
    phase = record(25, "patch", "provisioningrequests", kueue=False, namespace=ours)
    phase["requestObject"] = {"metadata": {"annotations": {kueue_scale.PHASE_ANNOTATION: "x"}}}
    other = record(26, "patch", "provisioningrequests", kueue=False, namespace=ours)
    other["requestObject"] = {"metadata": {"annotations": {"example.com/other": "x"}}}
    audit = kueue_scale.count_requests([phase, other], (0.0, 20.0), NAMESPACES, events_until=30.0)
    assert audit["counts"] == {"gangcheck_phase_records": 1}
    assert audit["after_window"] == {"gangcheck_phase_records patch provisioningrequests": 1}


def test_the_tail_reads_what_was_added_and_a_half_written_record_whole(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    before = record(1, "create", "events", kueue=False, namespace="bench-gangcheck")
    path.write_text(json.dumps(before) + "\n")
    tail = kueue_scale.AuditTail(tmp_path)  # from the end: what was there is not read
    assert list(tail.new()) == []

    event = record(2, "create", "events", kueue=True, namespace="bench-kueue")
    other = record(3, "patch", "workloads", kueue=True, namespace="bench-kueue")
    line = json.dumps(event)
    with path.open("a") as f:
        f.write(json.dumps(other) + "\n" + line[:20])
    assert list(tail.new()) == []  # the workloads record is not an Event; the Event half there
    with path.open("a") as f:
        f.write(line[20:] + "\n")
    read = list(tail.new())
    assert read == [event]
    assert kueue_scale.is_controller_event(read[0])
    assert not kueue_scale.is_controller_event(other)


def test_a_phase_record_carrying_its_requests_uid_is_one() -> None:
    """The record is written with its request's uid (a precondition, since 74e1918): still a
    phase record, not another patch; a patch changing anything else is not one."""
    ours = NAMESPACES["gangcheck"]
    annotations = {kueue_scale.PHASE_ANNOTATION: "Fulfilled"}
    phase = record(5, "patch", "provisioningrequests", kueue=False, namespace=ours)
    phase["requestObject"] = {"metadata": {"annotations": annotations, "uid": "u-1"}}
    other = record(6, "patch", "provisioningrequests", kueue=False, namespace=ours)
    other["requestObject"] = {"metadata": {"annotations": annotations, "labels": {"a": "b"}}}
    assert kueue_scale.is_phase_record(phase)
    assert not kueue_scale.is_phase_record(other)


async def test_the_last_cpu_sample_is_taken_once_every_gang_is_seen_admitted(
    monkeypatch: Any,
) -> None:
    """A burst admitted within one sampling period: the CPU it took is in the last sample
    (CI once read 0 s of gangcheck's CPU for 6 gangs all admitted 0.54 s after the burst:
    the last sample had been taken before they were, then the loop slept and ended)."""
    clock = {"cpu": 0.0, "admitted": 0}

    class Recorder:
        def admitted(self, side: str) -> int:
            return clock["admitted"]

    class Gangcheck:
        running = True

    class Stack:
        gangcheck = Gangcheck()

    async def sleep(_seconds: float) -> None:  # the work of the burst happens meanwhile
        clock["cpu"] += 0.07
        clock["admitted"] = 6

    monkeypatch.setattr(kueue_scale, "sample", lambda pid, last=None: (clock["cpu"], 100.0))
    monkeypatch.setattr(kueue_scale.asyncio, "sleep", sleep)
    usage, exited = await kueue_scale.follow(
        Stack(),  # type: ignore[arg-type]
        Recorder(),  # type: ignore[arg-type]
        6,
        pids={"gangcheck": 1, "kueue": 2},
        start=0.0,
        timeout=60,
    )
    assert exited is None
    assert usage == {"gangcheck": (0.07, 100.0), "kueue": (0.07, 100.0)}
