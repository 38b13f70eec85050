"""The store indexes a reconcile reads instead of scanning a namespace (`kube.informer.Index`):
what gangcheck made for each gang (`Caches.made_requests`, `made_templates`) and the pods
naming each PodGroup (`Caches.members`). After any sequence of store changes each answers as
a scan of the namespace would."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gangcheck.kube.informer import Index, Store
from gangcheck.logic.podgroups.gating import COSCHEDULING, COSCHEDULING_LABEL, UPSTREAM, group_of
from gangcheck.model.names import GROUP_ANNOTATION, WORKLOAD_ANNOTATION
from gangcheck.reconcile.caches import MADE_FOR_ANNOTATIONS, made_for, member_of

Obj = dict[str, Any]
NAMESPACES = ("a", "b")
NAMES = ("r1", "r2", "r3", "r4")
OWNERS = ("wl1", "wl2", "pg/g1")
GROUPS = ("g1", "g2")


def made(name: str, namespace: str, rv: int, workload: str | None, group: str | None) -> Obj:
    """A request or template naming a Workload, a PodGroup, both or neither."""
    annotations = {}
    if workload is not None:
        annotations[WORKLOAD_ANNOTATION] = workload
    if group is not None:
        annotations[GROUP_ANNOTATION] = group
    meta = {"name": name, "namespace": namespace, "resourceVersion": str(rv)}
    return {"metadata": {**meta, "annotations": annotations}}


def pod(name: str, namespace: str, rv: int, label: str | None, upstream: str | None) -> Obj:
    """A pod naming a coscheduling group by label, an upstream one in its spec, both or none
    (the spec wins: `group_of`)."""
    labels = {COSCHEDULING_LABEL: label} if label is not None else {}
    spec = {"schedulingGroup": {"podGroupName": upstream}} if upstream is not None else {}
    meta = {"name": name, "namespace": namespace, "resourceVersion": str(rv), "labels": labels}
    return {"metadata": meta, "spec": spec}


def scan_made(store: Store, key: tuple[str, str, str]) -> list[Obj]:
    annotation, namespace, owner = key
    found = [
        o
        for o in store.in_namespace(namespace)
        if (o["metadata"].get("annotations") or {}).get(annotation) == owner
    ]
    return sorted(found, key=lambda o: o["metadata"]["name"])


def scan_members(store: Store, key: tuple[str, str, str]) -> list[Obj]:
    namespace, api_group, name = key
    found = [p for p in store.in_namespace(namespace) if group_of(p) == (api_group, name)]
    return sorted(found, key=lambda o: o["metadata"]["name"])


MADE_KEYS = [(a, ns, o) for a in MADE_FOR_ANNOTATIONS for ns in NAMESPACES for o in OWNERS]
MEMBER_KEYS = [(ns, g, n) for ns in NAMESPACES for g in (UPSTREAM, COSCHEDULING) for n in GROUPS]
CASES = {
    "made for": (made, made_for, scan_made, MADE_KEYS, st.sampled_from(OWNERS)),
    "members": (pod, member_of, scan_members, MEMBER_KEYS, st.sampled_from(GROUPS)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_index_answers_as_a_scan_of_the_namespace(case: str, data: st.DataObject) -> None:
    build, keys_of, scan, keys, named = CASES[case]
    owner = st.one_of(st.none(), named)
    put = st.tuples(
        st.just("put"), st.sampled_from(NAMES), st.sampled_from(NAMESPACES), owner, owner
    )
    pop = st.tuples(st.just("pop"), st.sampled_from(NAMES), st.sampled_from(NAMESPACES))
    relist = st.tuples(st.just("relist"), st.lists(put, max_size=6))
    ops = data.draw(st.lists(st.one_of(put, pop, relist), max_size=30))
    store = Store()
    index = Index(store, keys_of)
    for rv, op in enumerate(ops, start=1):
        if op[0] == "put":
            store.put_if_newer(build(op[1], op[2], rv, op[3], op[4]))
        elif op[0] == "pop":
            existing = store.get(op[1], op[2])
            if existing is not None:
                store._pop(existing)  # as a watch DELETED event does
        else:
            store._replace([build(p[1], p[2], rv, p[3], p[4]) for p in op[1]])  # a relist
        for key in keys:
            assert index.of(key) == scan(store, key), key


def test_an_object_under_two_keys_leaves_both_when_it_changes() -> None:
    """An object a Workload and a PodGroup both name is found under each, and under neither
    once the annotations are gone (both old keys dropped, not only the first)."""
    store = Store()
    index: Index = Index(store, made_for)
    store.put_if_newer(made("r1", "a", 1, "wl1", "pg/g1"))
    assert [o["metadata"]["name"] for o in index.of((WORKLOAD_ANNOTATION, "a", "wl1"))] == ["r1"]
    assert [o["metadata"]["name"] for o in index.of((GROUP_ANNOTATION, "a", "pg/g1"))] == ["r1"]
    store.put_if_newer(made("r1", "a", 2, None, None))
    assert index.of((WORKLOAD_ANNOTATION, "a", "wl1")) == []
    assert index.of((GROUP_ANNOTATION, "a", "pg/g1")) == []
    assert index._members == {}
