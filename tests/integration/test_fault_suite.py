"""The fault suite (tests/faults/suite.py), bounded: a few minutes, fixed seeds.

Real kube-apiserver and etcd; gangcheck as real processes (two replicas, leader election),
each through a fault-injecting proxy; the suite plays Kueue core and the autoscaler. Faults a
real server cannot produce on demand come from the proxy; SIGKILLs are real; the adversarial
binds are real binds, refused (or not) by the real server under the fence policy of
manifests/base. ``make soak`` runs the long version (``test_fault_suite_long``: more gangs, more
seeds, more kills, 404 bursts, kube-apiserver restarts).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import Kube
from tests.faults.proxy import Rates
from tests.faults.suite import Scenario, Tally, run, table
from tests.integration.harness import Cluster, fence_policy_installed, until_fence_enforced

pytestmark = pytest.mark.integration

API_FAULTS = Rates(
    errors_500=0.05,
    throttled_429=0.02,
    resets=0.02,
    lost_answers=0.02,
    watch_cuts=0.02,
    not_found=0.02,
)


#: `make test`: one scenario of each kind, API faults and chaos (SIGKILLs, leader churn), with
#: adversarial binds.
BOUNDED = [
    Scenario("api faults + binds", seed=11, gangs=8, rates=API_FAULTS, binds=8),
    Scenario(
        "sigkill + leader churn + binds", seed=12, gangs=8, rates=API_FAULTS, kills=3, binds=8
    ),
]


def long_scenarios() -> list[Scenario]:
    """`make soak`: 4 seeds of 16 gangs, each with API faults and binds, and chaos with 404
    bursts and kube-apiserver restarts (which `make test` leaves out: the suite's own deliveries
    wait for the server too, so deadlines pass before the nodes exist; docs/faults.md); then
    the 8 gangs with 404 bursts on Workloads alone (a few times the baseline's time)."""
    out = []
    for seed in range(100, 104):
        common: dict[str, object] = {"seed": seed, "gangs": 16, "rates": API_FAULTS}
        out.append(Scenario(f"api faults + binds #{seed}", binds=16, **common))  # type: ignore[arg-type]
        out.append(
            Scenario(
                f"chaos #{seed}",
                kills=8,
                not_found_bursts=4,
                restarts=2,
                binds=16,
                timeout=600,
                **common,  # type: ignore[arg-type]
            )
        )
    out.append(Scenario("404 on workloads", seed=13, gangs=8, rates=API_FAULTS, not_found_bursts=3))
    return out


@pytest.fixture(scope="module")
def own_control_plane(testbed_binaries: dict[str, Path]) -> Iterator[ControlPlane]:
    """A control plane of the suite's own: it restarts kube-apiserver and floods it with
    faults, which no other test should share. The fence policy is installed, as the base
    and the chart install it."""
    with ControlPlane(binaries=testbed_binaries) as plane, fence_policy_installed(plane):
        yield plane


@pytest.mark.timeout(900)
async def test_fault_suite(
    own_control_plane: ControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every gang converges with 0 duplicate requests per attempt, 0 leaked requests,
    templates or nodes, 0 unsafe reclaims (a node deleted after a pod was bound to it among
    them), and no write by a replica while another led, under API faults, adversarial binds,
    and SIGKILLs with leader churn; the run without faults is the time baseline."""
    await run_suite(BOUNDED, own_control_plane, tmp_path, capsys)


@pytest.mark.soak
@pytest.mark.timeout(3600)
async def test_fault_suite_long(
    own_control_plane: ControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same verdicts over more seeds and gangs, with 404 bursts on Workloads and
    kube-apiserver restarts besides."""
    await run_suite(long_scenarios(), own_control_plane, tmp_path, capsys)


async def run_suite(
    runs: list[Scenario],
    control_plane: ControlPlane,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with await Kube.connect(str(control_plane.kubeconfig)) as kube:
        await until_fence_enforced(kube, (await Cluster.create(kube)).ns)
    baseline_scenario = Scenario("no faults (baseline)", seed=runs[0].seed, gangs=runs[0].gangs)
    baseline = await run(baseline_scenario, control_plane, tmp_path / "baseline")
    tallies: list[Tally] = [baseline]
    for i, scenario in enumerate(runs):
        tallies.append(await run(scenario, control_plane, tmp_path / f"run{i}"))
    with capsys.disabled():
        print("\n" + table(tallies, baseline))
    problems = [f"{t.scenario}: {p}" for t in tallies for p in t.problems]
    assert all(t.clean for t in tallies), "\n".join(problems)
    assert all(t.faults for t in tallies[1:]), "every faulty run injected faults"
    with_binds = [t for t, s in zip(tallies[1:], runs, strict=True) if s.binds]
    assert all(t.binds_accepted + t.binds_refused for t in with_binds), "binds were made"
