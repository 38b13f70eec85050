"""The index of what gangcheck made for each gang (`Caches.made_requests`, `made_templates`):
after any sequence of store changes it answers as a scan of the namespace would."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gangcheck.kube.informer import Store
from gangcheck.model.names import GROUP_ANNOTATION, WORKLOAD_ANNOTATION
from gangcheck.reconcile.caches import MadeFor

Obj = dict[str, Any]
NAMESPACES = ("a", "b")
OWNERS = ("wl1", "wl2", "pg/g1")
NAMES = ("r1", "r2", "r3", "r4")


def scan(store: Store, annotation: str, namespace: str, owner: str) -> list[Obj]:
    found = [
        o
        for o in store.in_namespace(namespace)
        if (o["metadata"].get("annotations") or {}).get(annotation) == owner
    ]
    return sorted(found, key=lambda o: o["metadata"]["name"])


def obj(name: str, namespace: str, rv: int, workload: str | None, group: str | None) -> Obj:
    annotations = {}
    if workload is not None:
        annotations[WORKLOAD_ANNOTATION] = workload
    if group is not None:
        annotations[GROUP_ANNOTATION] = group
    meta = {"name": name, "namespace": namespace, "resourceVersion": str(rv)}
    return {"metadata": {**meta, "annotations": annotations}}


owner = st.one_of(st.none(), st.sampled_from(OWNERS))
put = st.tuples(st.just("put"), st.sampled_from(NAMES), st.sampled_from(NAMESPACES), owner, owner)
pop = st.tuples(st.just("pop"), st.sampled_from(NAMES), st.sampled_from(NAMESPACES))
relist = st.tuples(st.just("relist"), st.lists(put, max_size=6))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(put, pop, relist), max_size=30))
def test_the_index_answers_as_a_scan_of_the_namespace(ops: list[Any]) -> None:
    store = Store()
    index = MadeFor(store)
    for rv, op in enumerate(ops, start=1):
        if op[0] == "put":
            store.put_if_newer(obj(op[1], op[2], rv, op[3], op[4]))
        elif op[0] == "pop":
            existing = store.get(op[1], op[2])
            if existing is not None:
                store._pop(existing)  # as a watch DELETED event does
        else:
            store._replace([obj(p[1], p[2], rv, p[3], p[4]) for p in op[1]])  # a relist
        for annotation in MadeFor.ANNOTATIONS:
            for namespace in NAMESPACES:
                for who in OWNERS:
                    assert index.of(annotation, namespace, who) == scan(
                        store, annotation, namespace, who
                    ), (annotation, namespace, who)
