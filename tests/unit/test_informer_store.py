"""An informer's store after a write of ours: the watch still brings the versions made before
that write, and the store must not go back to them (a gang decided again on such a version
undoes what it just wrote: seen end to end as a PodGroup's race winner cleared about a second
after its release, and a member released a moment before missing from the member cache),
while the handlers still hear another writer's change and not the echo of our write."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gangcheck.kube.client import Kube
from gangcheck.kube.informer import Index, Informer
from gangcheck.kube.resources import POD

Obj = dict[str, Any]


def pod(rv: int, *, node: str = "", label: str = "") -> Obj:
    meta: Obj = {"name": "p", "namespace": "ns", "resourceVersion": str(rv)}
    if label:
        meta["labels"] = {"gang": label}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": node}}


def informer() -> tuple[Informer, list[tuple[Obj | None, Obj | None]], Index]:
    inf = Informer(cast(Kube, object()), POD)
    heard: list[tuple[Obj | None, Obj | None]] = []
    inf.add_handler(lambda old, new: heard.append((old, new)))
    by_gang = Index(inf.store, lambda o: [o["metadata"].get("labels", {}).get("gang", "")])
    return inf, heard, by_gang


def watch(inf: Informer, kind: str, obj: Obj) -> None:
    inf._apply({"type": kind, "object": obj}, "0")


def rv(obj: Obj | None) -> str:
    assert obj is not None
    return str(obj["metadata"]["resourceVersion"])


def test_a_version_older_than_our_write_is_heard_but_not_stored() -> None:
    inf, heard, by_gang = informer()
    watch(inf, "ADDED", pod(98))
    inf.store.put_if_newer(pod(100, node="n1", label="g"))  # our write, answered
    watch(inf, "MODIFIED", pod(99, node="n1"))  # another writer's change, before ours

    stored = inf.store.get("p", "ns")
    assert rv(stored) == "100" and stored is not None and stored["metadata"]["labels"]
    assert [o["metadata"]["name"] for o in by_gang.of("g")] == ["p"]
    # the handlers hear the other writer's change as the watch brought it: 98 -> 99
    assert [(rv(o), rv(n)) for o, n in heard[1:]] == [("98", "99")]

    watch(inf, "MODIFIED", pod(100, node="n1", label="g"))  # the echo of our write
    assert rv(inf.store.get("p", "ns")) == "100"
    old, new = heard[-1]
    assert old == new  # the echo says nothing new: the handlers' echo filters drop it

    watch(inf, "MODIFIED", pod(101, node="n2", label="g"))
    assert rv(inf.store.get("p", "ns")) == "101"
    assert (rv(heard[-1][0]), rv(heard[-1][1])) == ("100", "101")


def test_without_a_write_of_ours_every_version_is_stored_and_heard() -> None:
    inf, heard, _ = informer()
    for version in (5, 6, 7):
        watch(inf, "ADDED" if version == 5 else "MODIFIED", pod(version))
        assert rv(inf.store.get("p", "ns")) == str(version)
    assert [(o and rv(o), rv(n)) for o, n in heard] == [(None, "5"), ("5", "6"), ("6", "7")]


def test_a_deletion_after_our_write_removes_it_and_forgets_what_was_behind() -> None:
    inf, heard, by_gang = informer()
    watch(inf, "ADDED", pod(10))
    inf.store.put_if_newer(pod(12, label="g"))
    watch(inf, "DELETED", pod(13, label="g"))
    assert inf.store.get("p", "ns") is None and by_gang.of("g") == []
    assert heard[-1][1] is None
    watch(inf, "ADDED", pod(14))  # made again: stored as the watch brings it
    assert rv(inf.store.get("p", "ns")) == "14"
    assert (heard[-1][0], rv(heard[-1][1])) == (None, "14")


def test_an_older_answer_of_ours_never_replaces_a_newer_version() -> None:
    inf, _, _ = informer()
    watch(inf, "ADDED", pod(20))
    inf.store.put_if_newer(pod(19))
    assert rv(inf.store.get("p", "ns")) == "20"
    watch(inf, "MODIFIED", pod(21))
    assert rv(inf.store.get("p", "ns")) == "21"


# ---- our own delete (Store.deleted): the object dropped at once, the watch's late versions
# of it kept out until its DELETED or a relist; another object of that name stored as usual.


def req(rv: int, *, uid: str = "u1", mark: str = "", finalizers: bool = False) -> Obj:
    meta: Obj = {"name": "r", "namespace": "ns", "resourceVersion": str(rv), "uid": uid}
    meta["labels"] = {"gang": "g"}
    if mark:
        meta["annotations"] = {"mark": mark}
    if finalizers:
        meta["finalizers"] = ["example.com/keep"]
        meta["deletionTimestamp"] = "2026-11-30T10:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta}


GONE_STATUS = {"kind": "Status", "status": "Success"}


def stored(inf: Informer) -> tuple[str, str, str] | None:
    """The stored object as (resourceVersion, uid, mark), None if none."""
    obj = inf.store.get("r", "ns")
    if obj is None:
        return None
    meta = obj["metadata"]
    return meta["resourceVersion"], meta["uid"], (meta.get("annotations") or {}).get("mark", "")


def delete(inf: Informer, answer: Obj | None, *, uid: str | None = "u1") -> None:
    inf.store.deleted("r", "ns", answer, uid=uid)


WATCH_LATE = "watch late: the delete answered first, then the versions before it, its DELETED"
WATCH_EARLY = "watch early: the DELETED came before the delete's answer"
MADE_AGAIN = "made again (another uid) before the watch's DELETED of the old one"
RELIST = "a relist before the watch's DELETED"


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param(
            [("delete", GONE_STATUS), ("MODIFIED", req(11, mark="late")), ("check", None),
             ("DELETED", req(12)), ("check", None), ("ADDED", req(13, uid="u2")),
             ("check", ("13", "u2", ""))],
            id=WATCH_LATE,
        ),
        pytest.param(
            [("delete", req(12)), ("MODIFIED", req(11, mark="late")), ("check", None),
             ("DELETED", req(12)), ("check", None)],
            id="the deleted object answered (its last state, not kept): dropped the same way",
        ),
        pytest.param(
            [("delete", None), ("MODIFIED", req(11, mark="late")), ("check", None),
             ("DELETED", req(12)), ("check", None)],
            id="a 404 (gone already): dropped the same way",
        ),
        pytest.param(
            [("DELETED", req(12)), ("delete", GONE_STATUS), ("check", None),
             ("ADDED", req(13, uid="u2")), ("check", ("13", "u2", ""))],
            id=WATCH_EARLY,
        ),
        pytest.param(
            [("delete", GONE_STATUS), ("put", req(13, uid="u2", mark="ours")),
             ("MODIFIED", req(11, mark="late")), ("check", ("13", "u2", "ours")),
             ("DELETED", req(12)), ("check", ("13", "u2", "ours")),
             ("ADDED", req(13, uid="u2", mark="ours")), ("check", ("13", "u2", "ours")),
             ("MODIFIED", req(14, uid="u2", mark="theirs")), ("check", ("14", "u2", "theirs"))],
            id=MADE_AGAIN,
        ),
        pytest.param(
            [("delete", GONE_STATUS), ("relist", [req(13, uid="u2")]),
             ("check", ("13", "u2", "")), ("DELETED", req(12)), ("check", ("13", "u2", ""))],
            id=RELIST,
        ),
        pytest.param(
            [("delete", GONE_STATUS), ("relist", []), ("ADDED", req(13)),
             ("check", ("13", "u1", ""))],
            id="a relist clears the tombstone: what the watch brings after it is stored",
        ),
        pytest.param(
            [("delete", req(12, finalizers=True)), ("check", ("12", "u1", "")),
             ("MODIFIED", req(11, mark="late")), ("check", ("12", "u1", "")),
             ("MODIFIED", req(12, finalizers=True)), ("MODIFIED", req(13, mark="freed")),
             ("check", ("13", "u1", "freed"))],
            id="kept by a finalizer: stored as answered, with its deletionTimestamp",
        ),
        pytest.param(
            [("delete", GONE_STATUS, None), ("MODIFIED", req(11, mark="late")),
             ("check", None)],
            id="no uid given: the stored object's is the one deleted",
        ),
        pytest.param(
            [("delete", {**GONE_STATUS, "details": {"uid": "u0"}}), ("check", ("10", "u1", ""))],
            id="the Status names another uid than the one stored: the store is left as it is",
        ),
    ],
)  # fmt: skip
def test_an_object_our_own_delete_removed_stays_removed(steps: list[tuple[Any, ...]]) -> None:
    inf, _, by_gang = informer()
    watch(inf, "ADDED", req(10))
    for step in steps:
        match step:
            case ("delete", answer):
                delete(inf, answer)
            case ("delete", answer, uid):
                delete(inf, answer, uid=uid)
            case ("put", obj):
                inf.store.put_if_newer(obj)
            case ("relist", objs):
                inf.store._replace(objs)
            case ("check", want):
                assert stored(inf) == want
                indexed = [o["metadata"]["uid"] for o in by_gang.of("g")]
                assert indexed == ([want[1]] if want else [])
            case (kind, obj):
                watch(inf, kind, obj)


def test_the_handlers_hear_the_watch_not_our_delete() -> None:
    """Our delete is not heard (the echo of our own write); what the watch brings of the
    object afterwards is, one version after the other, and its DELETED as the deletion."""
    inf, heard, _ = informer()
    watch(inf, "ADDED", req(10))
    delete(inf, GONE_STATUS)
    assert len(heard) == 1
    watch(inf, "MODIFIED", req(11, mark="theirs"))
    watch(inf, "DELETED", req(12))
    assert [(rv(o), n and rv(n)) for o, n in heard[1:]] == [("10", "11"), ("12", None)]


def test_put_if_newer_does_not_bring_back_what_our_delete_removed() -> None:
    """An answer read before the delete (a GET racing it) is not stored over the tombstone."""
    inf, _, _ = informer()
    watch(inf, "ADDED", req(10))
    delete(inf, GONE_STATUS)
    inf.store.put_if_newer(req(11, mark="read before"))
    assert stored(inf) is None
