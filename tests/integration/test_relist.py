"""A relist after 410 Gone whose list was served before a delete or write of ours was answered
does not undo them: the deleted object does not come back, the patched one does not go back
to its version before the patch, the one we made is not removed, not even until the watch
catches up (a gang decided on that view would make again, claim again, or misjudge a reclaim).

Real kube-apiserver behind the fault-injecting proxy (tests/faults/proxy.py), which answers
the watch 410; the relist's list is the server's, read and then held by the client until our
delete, patch and create are answered, so it is older than them, as a list served just before
them is.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from gangcheck.kube.client import Kube
from gangcheck.kube.informer import Informer, object_key
from gangcheck.model.objects import Obj
from tests.faults.proxy import STATUS, FaultProxy, Faults, Rule
from tests.integration.harness import Cluster, eventually
from tests.integration.test_watches import (  # the proxy's fixtures: pytest finds them here
    CONFIG_MAP,
    faults,  # noqa: F401
    make,
    proxied_kube,  # noqa: F401
    proxy,  # noqa: F401
    running,
    seen,
)

pytestmark = pytest.mark.integration


class HeldList:
    """A client whose next list, once `hold` is set, is read from the server and then held
    (`listed` set) until `release` is set; its watches are the client's own."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.hold = False
        self.listed = asyncio.Event()
        self.release = asyncio.Event()

    async def list_objects(self, *args: Any, **kwargs: Any) -> Obj:
        answer = await self.kube.list_objects(*args, **kwargs)
        if self.hold:
            self.hold = False
            self.listed.set()
            await self.release.wait()
        return answer

    def watch(self, *args: Any, **kwargs: Any) -> Any:
        return self.kube.watch(*args, **kwargs)


async def test_a_relist_older_than_our_delete_patch_and_create_undoes_none_of_them(
    kube: Kube,
    proxied_kube: Kube,  # noqa: F811
    proxy: FaultProxy,  # noqa: F811
    faults: Faults,  # noqa: F811
    cluster: Cluster,
) -> None:
    for name in ("deleted", "patched"):
        await make(kube, cluster, name)
    held = HeldList(proxied_kube)
    informer = Informer(
        cast(Kube, held), CONFIG_MAP, label_selector=f"test={cluster.ns}", retry_delay=0.2
    )
    async with running(informer):
        for name in ("deleted", "patched"):
            await eventually(seen(informer, cluster, name), what=f"{name} listed")
        held.hold = True
        faults.rules.append(Rule(STATUS, status=410, path=r"/configmaps$", watch=True, times=1))

        async def relisting() -> bool:  # the watch answered 410 as it opens, or once cut
            return held.listed.is_set() or proxy.cut(r"/configmaps$") > 0

        await eventually(relisting, what="a watch cut, or answered 410")
        await asyncio.wait_for(held.listed.wait(), 20)  # the relist's list is read: older

        store = informer.store
        doomed = store.get("deleted", cluster.ns)
        assert doomed is not None
        answer = await kube.delete(CONFIG_MAP, "deleted", cluster.ns)
        store.deleted("deleted", cluster.ns, answer, uid=doomed["metadata"]["uid"])
        patch = {"data": {"by": "us"}}
        store.put_if_newer(await kube.merge_patch(CONFIG_MAP, "patched", patch, cluster.ns))
        await make(kube, cluster, "made")
        store.put_if_newer(await kube.get(CONFIG_MAP, "made", cluster.ns))

        undone: list[str] = []  # every change of the store that undid one of ours

        def record(old: Obj | None, new: Obj | None) -> None:
            name = object_key(new or old or {"metadata": {"name": ""}}).split("/")[-1]
            if name == "deleted" and new is not None:
                undone.append(f"deleted brought back at {new['metadata']['resourceVersion']}")
            if name == "patched" and new is not None and (new.get("data") or {}) != patch["data"]:
                undone.append(f"patched back at {new['metadata']['resourceVersion']}")
            if name == "made" and new is None:
                undone.append("made removed")

        store.add_indexer(record)
        held.release.set()
        await make(kube, cluster, "after")  # the watch from the list brings it after ours
        await eventually(seen(informer, cluster, "after"), what="the watch past our writes")

        assert undone == []
        assert informer.relists == 1
        assert store.get("deleted", cluster.ns) is None
        kept = store.get("patched", cluster.ns)
        assert kept is not None and kept.get("data") == patch["data"]
        assert store.get("made", cluster.ns) is not None
        assert store._tombstones == {} and store._behind == {}  # the watch caught up
