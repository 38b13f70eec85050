"""How long one gang fit takes as clusters grow: extended resources alone (the baseline) beside
the same gang asking its GPUs through DRA claims, and under a required topology.

The controller runs this fit on every reconcile of a gang in flight (each node or pod change
brings one), so its cost bounds how many gangs one controller can follow. Figures are the
median of several runs, in milliseconds, and the ratio to the baseline on the same machine in
the same run (machines are noisy; the ratio is what to compare).

Cases, for N nodes of 8 GPUs each (1 in 8 nodes full, so placement has to look):
- fits:     a gang of N/2 members x 8 GPUs in two pod sets: it fits;
- no fit:   a gang of N+1 members: it does not, and every pod set order is tried;
- topology: the fitting gang, its pod sets each required inside one rack of 16 nodes.

At cluster scale (`--scale`, what `make bench` runs): 5,000 nodes, 1 in 5 with 8 GPUs (the
others CPU only), and 50,000 bound pods, 10 per node (on 1 in 8 GPU nodes one of them holds all
8 GPUs); a gang of 16 members x 8 GPUs in two pod sets, its GPUs as an extended resource or
through DRA claims, fitted as the controller fits it (`fits_now`, from the cached objects);
then the same fit right after one bound pod changed (deleted), as the next reconcile sees it;
and the same for a gang waiting for capacity (it does not fit: every node gets a reason).
Then the same fits with 1, 10 and 20 bound pods per node (5,000 to 100,000 pods), side by
side: the ratio of the last to the first shows whether a fit's time follows the pod count.

Usage: python benchmarks/fit_scale.py [--nodes 32,128,512] [--repeat 5] [--scale [--scale-only]]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gangcheck.logic.attempt.fulfillment import ClusterView, GangSpec, fits_now
from gangcheck.logic.placement.dra import DraContext, Inventory, build_inventory
from gangcheck.logic.placement.fit import GangPodSet, member_from_template, node_view
from gangcheck.logic.placement.topology import fit_in_domains
from gangcheck.logic.placement.usage import DeviceInventory, NodeUsage

Obj = dict[str, Any]
GPUS = 8
DRIVER = "gpu.bench.example.com"


def node(i: int) -> Obj:
    return {
        "metadata": {
            "name": f"n{i:04d}",
            "labels": {"rack": f"r{i // 16}"},
            "resourceVersion": "1",
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def busy_pod(i: int, dra: bool) -> Obj:
    """A pod filling node i (every 8th node): its GPUs, or its devices through a claim."""
    spec: Obj = {"nodeName": f"n{i:04d}", "containers": [container(dra)]}
    return {"metadata": {"name": f"busy-{i}", "namespace": "bench"}, "spec": spec}


def container(dra: bool) -> Obj:
    if dra:
        return {"name": "c", "resources": {"requests": {"cpu": "1"}, "claims": [{"name": "gpu"}]}}
    gpus = str(GPUS)
    return {
        "name": "c",
        "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": gpus}, "limits": {}},
    }


def template(dra: bool, flavour: str) -> Obj:
    spec: Obj = {"containers": [container(dra)], "nodeSelector": {}}
    if dra:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "eight"}]
    spec["containers"][0]["resources"]["requests"]["memory"] = flavour
    return {"spec": spec}


def inventory(nodes: int) -> Any:
    slices = [
        {
            "metadata": {"name": f"n{i:04d}-gpus"},
            "spec": {
                "driver": DRIVER,
                "pool": {"name": f"n{i:04d}", "generation": 1, "resourceSliceCount": 1},
                "nodeName": f"n{i:04d}",
                "devices": [{"name": f"gpu-{d}"} for d in range(GPUS)],
            },
        }
        for i in range(nodes)
    ]
    klass = {
        "metadata": {"name": "gpu"},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }
    claims = [
        {
            "metadata": {"name": f"busy-{i}", "namespace": "bench"},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "g", "driver": DRIVER, "pool": f"n{i:04d}",
                             "device": f"gpu-{d}"}
                            for d in range(GPUS)
                        ]
                    }
                }
            },
        }
        for i in range(0, nodes, 8)
    ]  # fmt: skip
    return build_inventory(slices, [klass], claims)


CLAIM_TEMPLATE = {
    "metadata": {"name": "eight", "namespace": "bench"},
    "spec": {
        "spec": {
            "devices": {
                "requests": [{"name": "g", "exactly": {"deviceClassName": "gpu", "count": GPUS}}]
            }
        }
    },
}


def gang(members: int, dra: bool) -> list[GangPodSet]:
    context = DraContext.of([CLAIM_TEMPLATE]) if dra else None
    half = members // 2
    return [
        GangPodSet("a", half, member_from_template(template(dra, "1Gi"), context)),
        GangPodSet("b", members - half, member_from_template(template(dra, "2Gi"), context)),
    ]


def timed(work: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    samples, result = [], None
    for _ in range(repeat):
        began = time.perf_counter()
        result = work()
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples), result


SCALE_NODES, PODS_PER_NODE, GPU_NODE_EVERY, SCALE_MEMBERS = 5000, 10, 5, 16


def scale_objects(dra: bool, pods_per_node: int = PODS_PER_NODE) -> dict[str, list[Obj]]:
    """The cluster at scale as the caches hold it: nodes, bound pods, DRA objects."""
    gpu_nodes = range(0, SCALE_NODES, GPU_NODE_EVERY)
    nodes = [node(i) if i % GPU_NODE_EVERY == 0 else cpu_node(i) for i in range(SCALE_NODES)]
    if dra:
        for i in gpu_nodes:
            del nodes[i]["status"]["allocatable"]["nvidia.com/gpu"]
    pods = [small_pod(i, k) for i in range(SCALE_NODES) for k in range(pods_per_node - 1)] + [
        busy_pod(i, dra) if i % (8 * GPU_NODE_EVERY) == 0 else small_pod(i, pods_per_node - 1)
        for i in range(SCALE_NODES)
    ]
    objects: dict[str, list[Obj]] = {"nodes": nodes, "pods": pods}
    if dra:
        objects.update(scale_dra(list(gpu_nodes)))
    return objects


def cpu_node(i: int) -> Obj:
    obj = node(i)
    del obj["status"]["allocatable"]["nvidia.com/gpu"]
    return obj


def small_pod(i: int, k: int) -> Obj:
    spec = {"nodeName": f"n{i:04d}", "containers": [{"name": "c", "resources": {
        "requests": {"cpu": "500m", "memory": "1Gi"}}}]}  # fmt: skip
    return {"metadata": {"name": f"p-{i}-{k}", "namespace": "bench"}, "spec": spec,
            "status": {"phase": "Running"}}  # fmt: skip


def scale_dra(gpu_nodes: list[int]) -> dict[str, list[Obj]]:
    slices = [
        {
            "metadata": {"name": f"n{i:04d}-gpus"},
            "spec": {
                "driver": DRIVER,
                "pool": {"name": f"n{i:04d}", "generation": 1, "resourceSliceCount": 1},
                "nodeName": f"n{i:04d}",
                "devices": [{"name": f"gpu-{d}"} for d in range(GPUS)],
            },
        }
        for i in gpu_nodes
    ]
    klass = {
        "metadata": {"name": "gpu"},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }
    claims = [
        {
            "metadata": {"name": f"busy-{i}", "namespace": "bench"},
            "status": {"allocation": {"devices": {"results": [
                {"request": "g", "driver": DRIVER, "pool": f"n{i:04d}", "device": f"gpu-{d}"}
                for d in range(GPUS)
            ]}}},
        }
        for i in gpu_nodes
        if i % (8 * GPU_NODE_EVERY) == 0
    ]  # fmt: skip
    return {
        "resource_slices": slices,
        "device_classes": [klass],
        "resource_claims": claims,
        "claim_templates": [CLAIM_TEMPLATE],
    }


class KeptDevices:
    """The DRA inputs as the controller keeps them (reconcile/caches.py), from these objects."""

    def __init__(self, objects: dict[str, list[Obj]]) -> None:
        self.objects = objects
        self.inventory = DeviceInventory()

    def dra(self, namespace: str) -> tuple[DraContext, Inventory]:
        get = self.objects.get
        here = [o for o in get("claim_templates", []) if o["metadata"]["namespace"] == namespace]
        inventory = self.inventory.inventory(
            get("resource_slices", []), get("device_classes", []), get("resource_claims", [])
        )
        return DraContext.of(here), inventory


def scale_capacity(objects: dict[str, list[Obj]]) -> ClusterView:
    """The capacity a reconcile reads: node views and bound pods' use kept from events."""
    cluster = NodeUsage()
    for obj in objects["nodes"]:
        cluster.on_node(None, obj)
    for obj in objects["pods"]:
        cluster.on_pod(None, obj)
    return ClusterView(nodes=tuple(objects["nodes"]), cluster=cluster, devices=KeptDevices(objects))


def scale_gang(dra: bool) -> GangSpec:
    half = SCALE_MEMBERS // 2
    return GangSpec(
        (("a", half, template(dra, "1Gi")), ("b", SCALE_MEMBERS - half, template(dra, "2Gi"))),
        namespace="bench",
    )


def run_scale(repeat: int) -> None:
    """One fit at cluster scale, and one right after a bound pod changed."""
    print(f"{SCALE_NODES} nodes, {SCALE_NODES * PODS_PER_NODE} bound pods, "
          f"a gang of {SCALE_MEMBERS} x {GPUS} GPUs")  # fmt: skip
    print(f"{'case':26} {'one fit ms':>11} {'after 1 pod ms':>15}  verdict")
    for dra in (False, True):
        objects = scale_objects(dra)
        gang = scale_gang(dra)
        capacity = scale_capacity(objects)
        one, result = timed(functools.partial(fits_now, capacity, gang), repeat)
        changed = timed_after_change(capacity, objects["pods"], gang, repeat)
        case = "DRA claims" if dra else "extended resource"
        print(f"{case:26} {one:>11.1f} {changed:>15.1f}  {result.placeable}/{result.total}")
        waiting = waiting_gang(dra)
        one, result = timed(functools.partial(fits_now, capacity, waiting), repeat)
        changed = timed_after_change(capacity, objects["pods"], waiting, repeat)
        case = f"{case}, no fit"
        print(f"{case:26} {one:>11.1f} {changed:>15.1f}  {result.placeable}/{result.total}")


POD_COUNTS = (1, 10, 20)
"""Bound pods per node in the sweep: 5,000 to 100,000 bound pods."""


def run_pods_sweep(repeat: int) -> None:
    """The same fits with ever more bound pods: what a fit reads is kept per node, so its
    time should not follow the number of pods."""
    counts = [f"{SCALE_NODES * n:,} pods" for n in POD_COUNTS]
    print(f"\n{'fit ms, 5,000 nodes with':26}" + "".join(f"{c:>13}" for c in counts) + "  ratio")
    rows: dict[str, list[float]] = {}
    for per_node in POD_COUNTS:
        for dra in (False, True):
            capacity = scale_capacity(scale_objects(dra, per_node))
            case = "DRA claims" if dra else "extended resource"
            for name, gang in ((case, scale_gang(dra)), (f"{case}, no fit", waiting_gang(dra))):
                fits_now(capacity, gang)  # the first fit fills what is kept between fits
                ms, _ = timed(functools.partial(fits_now, capacity, gang), repeat)
                rows.setdefault(name, []).append(ms)
    for name, figures in rows.items():
        cells = "".join(f"{ms:>13.1f}" for ms in figures)
        print(f"{name:26}{cells}  {figures[-1] / figures[0]:.2f}x")


def waiting_gang(dra: bool) -> GangSpec:
    """A gang waiting for capacity: more members of 8 GPUs than there are free GPU nodes."""
    members = SCALE_NODES // GPU_NODE_EVERY + 1
    return GangSpec((("a", members, template(dra, "1Gi")),), namespace="bench")


def timed_after_change(
    capacity: ClusterView, pods: list[Obj], gang: GangSpec, repeat: int
) -> float:
    """A bound pod deleted (its event applied), then the fit: what the next reconcile pays."""
    assert capacity.cluster is not None
    samples = []
    for i in range(repeat):
        pod = pods[i]
        began = time.perf_counter()
        capacity.cluster.on_pod(pod, None)
        fits_now(capacity, gang)
        samples.append((time.perf_counter() - began) * 1000)
        capacity.cluster.on_pod(None, pod)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="32,128,512")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--scale", action="store_true", help="also the cluster-scale case")
    parser.add_argument("--scale-only", action="store_true", help="only the cluster-scale case")
    args = parser.parse_args(argv)
    if args.scale or args.scale_only:
        run_scale(args.repeat)
        run_pods_sweep(args.repeat)
    if args.scale_only:
        return 0
    print(f"{'nodes':>5} {'case':9} {'baseline ms':>12} {'DRA ms':>9} {'ratio':>6}  verdicts")
    for n in (int(x) for x in args.nodes.split(",")):
        views = [node_view(node(i)) for i in range(n)]
        devices = inventory(n)
        for case, members, racks in (
            ("fits", n // 2, False),
            ("no fit", n + 1, False),
            ("topology", 12, True),
        ):
            row = []
            for dra in (False, True):
                run = functools.partial(
                    fit_in_domains,
                    gang(members, dra),
                    views,
                    [busy_pod(i, dra) for i in range(0, n, 8)],
                    {"a": "rack", "b": "rack"} if racks else None,
                    devices=devices if dra else None,
                )
                ms, result = timed(run, args.repeat)
                row.append((ms, result))
            (base, base_result), (dra_ms, dra_result) = row
            verdicts = (
                f"{base_result.result.placeable}/{base_result.result.total} vs "
                f"{dra_result.result.placeable}/{dra_result.result.total}"
            )
            print(f"{n:>5} {case:9} {base:>12.1f} {dra_ms:>9.1f} {dra_ms / base:>6.1f}  {verdicts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
