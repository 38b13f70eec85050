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


# ---- a relist (after 410 Gone) answered before our own write or delete reached it: the list
# is the server as it was at its resourceVersion, and what we wrote or deleted after that is
# newer than anything in it. What the list cannot have seen is kept; the rest is replaced.


class Listing:
    """A client whose list answers `items` at `rv` (only what `Informer._list` calls)."""

    def __init__(self, rv: int, items: list[Obj]) -> None:
        self.answer: Obj = {"metadata": {"resourceVersion": str(rv)}, "items": items}

    async def list_objects(self, *_: Any, **__: Any) -> Obj:
        return self.answer


async def relist(inf: Informer, rv: int, items: list[Obj]) -> None:
    """The informer's own list, answered at `rv` with `items`."""
    inf.kube = cast(Kube, Listing(rv, items))
    await inf._list()


def mark(obj: Obj | None) -> str:
    assert obj is not None
    return str((obj["metadata"].get("annotations") or {}).get("mark", ""))


async def test_a_relist_older_than_our_delete_does_not_bring_the_object_back() -> None:
    """Our delete answered at 12, the relist answered at 11 with the object still in it (the
    list was served before the delete): it stays deleted, and the versions the watch brings
    from 11 on are kept out until its DELETED."""
    inf, heard, by_gang = informer()
    watch(inf, "ADDED", req(10))
    delete(inf, req(12))  # gone: its last state answered
    await relist(inf, 11, [req(11, mark="listed")])
    assert stored(inf) is None and by_gang.of("g") == []
    # the handlers hear what the list says of it, as they would the watch: 10 -> 11
    assert (rv(heard[-1][0]), rv(heard[-1][1])) == ("10", "11")
    watch(inf, "MODIFIED", req(12, mark="late"))
    assert stored(inf) is None
    watch(inf, "DELETED", req(13))
    assert stored(inf) is None and heard[-1][1] is None
    watch(inf, "ADDED", req(14, uid="u2"))  # made again: stored as usual
    assert stored(inf) == ("14", "u2", "")


async def test_a_relist_older_than_our_delete_without_the_object_keeps_the_tombstone() -> None:
    """The list (at 9) was served before the object was made: its ADDED, which the watch from
    9 still brings, must not bring back what our delete (at 12) removed."""
    inf, _, _ = informer()
    watch(inf, "ADDED", req(10))
    inf.store.put_if_newer(req(11, mark="ours"))
    delete(inf, GONE_STATUS)
    await relist(inf, 9, [])
    assert stored(inf) is None
    watch(inf, "ADDED", req(10))
    assert stored(inf) is None


@pytest.mark.parametrize(
    ("listed", "at"),
    [
        pytest.param([req(13, uid="u2")], 13, id="another object of that name listed"),
        pytest.param([], 12, id="listed at the deletion or after, without the object"),
    ],
)
async def test_a_relist_at_or_past_our_delete_clears_the_tombstone(
    listed: list[Obj], at: int
) -> None:
    inf, _, _ = informer()
    watch(inf, "ADDED", req(10))
    delete(inf, req(12))
    await relist(inf, at, listed)
    assert inf.store._tombstones == {}
    watch(inf, "ADDED", req(20))  # the watch from the list on: stored as it brings it
    assert stored(inf) == ("20", "u1", "")


async def test_a_relist_older_than_our_delete_and_our_create_keeps_what_we_made() -> None:
    """We deleted the object (at 12) and made another of its name (another uid, at 13); the
    list, at 11, still has the deleted one: it stays deleted, and the one we made is kept
    (not told removed) until the watch from 11 brings the DELETED and the ADDED."""
    inf, heard, by_gang = informer()
    watch(inf, "ADDED", req(10))
    delete(inf, req(12))
    inf.store.put_if_newer(req(13, uid="u2", mark="ours"))
    told = len(heard)
    await relist(inf, 11, [req(11, mark="listed")])
    assert stored(inf) == ("13", "u2", "ours") and len(by_gang.of("g")) == 1
    assert all(new is not None for _, new in heard[told:])
    watch(inf, "MODIFIED", req(11, mark="late"))
    watch(inf, "DELETED", req(12))
    assert stored(inf) == ("13", "u2", "ours")
    watch(inf, "ADDED", req(13, uid="u2", mark="ours"))
    watch(inf, "MODIFIED", req(14, uid="u2", mark="theirs"))
    assert stored(inf) == ("14", "u2", "theirs")


async def test_a_relist_older_than_our_write_keeps_our_write() -> None:
    """Our patch answered at 12; the list, at 11, has the object as it was before it: the
    store keeps our write, the handlers hear the list's version (another writer's change at
    11), and the watch's versions older than our write are heard, not stored."""
    inf, heard, by_gang = informer()
    watch(inf, "ADDED", req(10))
    inf.store.put_if_newer(req(12, mark="ours"))
    await relist(inf, 11, [req(11, mark="theirs")])
    assert stored(inf) == ("12", "u1", "ours") and len(by_gang.of("g")) == 1
    assert [(rv(o), rv(n), mark(n)) for o, n in heard[1:]] == [("10", "11", "theirs")]
    watch(inf, "MODIFIED", req(12, mark="ours"))  # the echo of our write
    assert stored(inf) == ("12", "u1", "ours")
    watch(inf, "MODIFIED", req(13, mark="next"))
    assert stored(inf) == ("13", "u1", "next")


async def test_a_relist_older_than_our_create_keeps_what_we_made() -> None:
    """We made the object (answered at 12) after the list (at 11) was served: it is kept,
    not told removed, and the watch's ADDED of it is the echo."""
    inf, heard, by_gang = informer()
    inf.store.put_if_newer(req(12, mark="ours"))
    await relist(inf, 11, [])
    assert stored(inf) == ("12", "u1", "ours") and len(by_gang.of("g")) == 1
    assert heard == []
    watch(inf, "ADDED", req(12, mark="ours"))
    assert stored(inf) == ("12", "u1", "ours")


async def test_a_kept_write_does_not_go_back_to_an_older_version_the_watch_brings() -> None:
    """Made (at 12) and patched (at 14) by us, the list at 11 without it: the watch from 11
    brings the ADDED at 12, older than our patch, which is heard and not stored."""
    inf, _, _ = informer()
    inf.store.put_if_newer(req(12))
    inf.store.put_if_newer(req(14, mark="patched"))
    await relist(inf, 11, [])
    watch(inf, "ADDED", req(12))
    assert stored(inf) == ("14", "u1", "patched")
    watch(inf, "MODIFIED", req(14, mark="patched"))
    watch(inf, "MODIFIED", req(15, mark="theirs"))
    assert stored(inf) == ("15", "u1", "theirs")


@pytest.mark.parametrize(
    ("listed", "want"),
    [
        pytest.param([req(12, mark="listed")], ("12", "u1", "listed"), id="listed at our write"),
        pytest.param([req(13, mark="listed")], ("13", "u1", "listed"), id="listed past it"),
        pytest.param([], None, id="not listed, the list past our write: gone since"),
    ],
)
async def test_a_relist_at_or_past_our_write_is_taken_as_it_is(
    listed: list[Obj], want: tuple[str, str, str] | None
) -> None:
    inf, _, _ = informer()
    watch(inf, "ADDED", req(10))
    inf.store.put_if_newer(req(12, mark="ours"))
    await relist(inf, 13, listed)
    assert stored(inf) == want
    assert inf.store._behind == {}


async def test_a_store_emptied_for_a_resource_not_served_keeps_nothing() -> None:
    """Not served (no list at all): the store is emptied, our writes and deletes included."""
    inf, _, _ = informer()
    watch(inf, "ADDED", req(10))
    inf.store.put_if_newer(req(12, mark="ours"))
    inf.store._replace([])
    assert stored(inf) is None and inf.store._behind == {} and inf.store._tombstones == {}


# ---- an answer of ours read after the watch (or a list) is past its version: the object is
# not in the store then only if it was deleted since (by another writer), and stays out.


def test_an_answer_read_after_the_watch_brought_the_deletion_does_not_bring_it_back() -> None:
    """Our write answered at 12, and before the writer read the answer the watch brought
    that version and another writer's delete: the object stays gone (a Workload deleted as
    its check was written stayed in the cache, its request never withdrawn: a flake of
    tests/integration/test_slices.py)."""
    inf, heard, by_gang = informer()
    watch(inf, "ADDED", req(10))
    watch(inf, "MODIFIED", req(12, mark="ours"))  # the echo of our write
    watch(inf, "DELETED", req(13, mark="ours"))  # another writer's delete
    inf.store.put_if_newer(req(12, mark="ours"))  # the answer, read now
    assert stored(inf) is None and by_gang.of("g") == []
    assert heard[-1][1] is None
    watch(inf, "ADDED", req(14, uid="u2"))  # made again: stored as the watch brings it
    assert stored(inf) == ("14", "u2", "")


def test_an_answer_read_after_a_bookmark_past_it_does_not_bring_a_deleted_object_back() -> None:
    """The deletion's DELETED came before a bookmark past our write's version (one watch
    ended, the next one from the last version seen): what is not in the store then is gone."""
    inf, _, _ = informer()
    watch(inf, "ADDED", req(10))
    watch(inf, "DELETED", req(13))
    inf._apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}}, "13")
    inf.store.put_if_newer(req(12, mark="ours"))
    assert stored(inf) is None


@pytest.mark.parametrize(
    "seen",
    [
        pytest.param([("ADDED", 10)], id="the watch not yet at our write: the answer is stored"),
        pytest.param([], id="nothing listed or watched yet: the answer is stored"),
    ],
)
def test_an_answer_newer_than_what_the_watch_brought_is_stored(
    seen: list[tuple[str, int]],
) -> None:
    inf, _, _ = informer()
    for kind, version in seen:
        watch(inf, kind, req(version, uid="u0"))
    inf.store.put_if_newer(req(12, mark="ours"))
    assert stored(inf) == ("12", "u1", "ours")


async def test_a_relist_not_showing_an_object_keeps_an_older_answer_of_ours_out() -> None:
    """Listed at 13 without the object: an answer of ours at 12 read after is of an object
    gone (deleted before the list); one at 14 is of an object made after it."""
    inf, _, _ = informer()
    await relist(inf, 13, [])
    inf.store.put_if_newer(req(12, mark="ours"))
    assert stored(inf) is None
    inf.store.put_if_newer(req(14, mark="ours"))
    assert stored(inf) == ("14", "u1", "ours")
