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

Usage: python benchmarks/fit_scale.py [--nodes 32,128,512] [--repeat 5]
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

from gangcheck.logic.placement.dra import DraContext, build_inventory
from gangcheck.logic.placement.fit import GangPodSet, member_from_template, node_view
from gangcheck.logic.placement.topology import fit_in_domains

Obj = dict[str, Any]
GPUS = 8
DRIVER = "gpu.bench.example.com"


def node(i: int) -> Obj:
    return {
        "metadata": {"name": f"n{i:04d}", "labels": {"rack": f"r{i // 16}"}},
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="32,128,512")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
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
