"""An informer's store after a write of ours: the watch still brings the versions made before
that write, and the store must not go back to them (a gang decided again on such a version
undoes what it just wrote: seen end to end as a PodGroup's race winner cleared about a second
after its release, and a member released a moment before missing from the member cache),
while the handlers still hear another writer's change and not the echo of our write."""

from __future__ import annotations

from typing import Any, cast

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
