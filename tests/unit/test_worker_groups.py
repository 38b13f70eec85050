"""make test's workers: what shares a started stack is one group (tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.conftest import in_order, worker_group


@pytest.mark.parametrize(
    ("nodeid", "group"),
    [
        ("tests/e2e/test_gangcheck.py::test_x", "tests/e2e"),
        ("tests/e2e/test_helm.py::test_y[a::b]", "tests/e2e"),
        ("tests/e2e/test_kind_deploy.py::test_z", "tests/e2e/test_kind_deploy.py"),
        ("tests/e2e/test_bench.py::test_b", "tests/e2e/test_bench.py"),
        ("tests/e2e/karpenter/test_karpenter.py::test_k", "tests/e2e/karpenter"),
        ("tests/e2e/karpenter/test_packing.py::test_p", "tests/e2e/karpenter"),
        ("tests/integration/test_leader.py::test_l", "tests/integration/test_leader.py"),
        ("tests/unit/test_hold.py::test_h[x]", "tests/unit/test_hold.py"),
        ("hack/devtools/tests/test_testbed.py::test_t", "hack/devtools/tests/test_testbed.py"),
    ],
)
def test_each_stack_is_started_by_one_worker(nodeid: str, group: str) -> None:
    assert worker_group(nodeid) == group


def test_groups_that_start_stacks_go_first_then_integration_then_unit() -> None:
    scopes = {  # as collected, each with its number of tests
        "tests/unit/test_a.py": 3,
        "tests/integration/test_i.py": 1,
        "tests/e2e/multicluster": 1,
        "tests/e2e": 2,
        "tests/unit/test_b.py": 1,
        "hack/devtools/tests/test_d.py": 2,
    }
    assert in_order(scopes) == [
        "tests/e2e",  # the session stack's group: 2 tests
        "tests/e2e/multicluster",
        "hack/devtools/tests/test_d.py",
        "tests/integration/test_i.py",
        "tests/unit/test_a.py",
        "tests/unit/test_b.py",
    ]
