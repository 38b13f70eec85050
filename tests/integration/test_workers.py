"""make test's workers, as pytest-xdist really hands them the tests (tests/conftest.py): each
group runs whole on one worker, so a stack its tests share is started once. A pytest of a few
unit modules run on three workers, its report read back."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The smaller first: the groups are handed out larger first, not in this order.
MODULES = (
    "tests/unit/test_worker_groups.py",
    "tests/unit/test_writes_at_once.py",
    "tests/unit/test_applier.py",
)
ARGS = ("-p", "no:cacheprovider", "-n", "3", "--dist", "loadscope", "-v")
REPORT = re.compile(r"^\[(gw\d+)\] \[\s*\d+%\] (\w+) (\S.*?)\s*$", re.M)


def test_each_group_runs_whole_on_one_worker() -> None:
    """Before, the groups were put in order by reordering each worker's collection, which
    the workers never saw: each ran the test at the index it was sent in its own collection,
    and every group was scattered over the workers (the full stack started three times)."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *MODULES, *ARGS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    outcomes: dict[str, list[str]] = defaultdict(list)
    for worker, outcome, nodeid in REPORT.findall(run.stdout):
        workers[nodeid.split("::", 1)[0]].add(worker)
        outcomes[nodeid].append(outcome)
    assert set(workers) == set(MODULES), run.stdout[-3000:]
    assert {m: len(w) for m, w in workers.items()} == {m: 1 for m in MODULES}, dict(workers)
    assert all(o == ["PASSED"] for o in outcomes.values()), outcomes
