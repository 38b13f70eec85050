"""What the demo says about itself: the same words in the README, `make help` and
`gangcheck-dev --help`, and hints that name Kueue's resources so kubectl finds them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from gangcheck_dev import demo
from gangcheck_dev.cli import DEMO, main

from gangcheck.kube.resources import PROVISIONING_REQUEST, UPSTREAM_POD_GROUP_V1BETA1, WORKLOAD

REPO = Path(__file__).resolve().parents[3]


def _words(text: str) -> str:
    return " ".join(text.split())


def test_the_readme_says_what_the_demo_runs() -> None:
    assert f"make demo   # {DEMO}" in (REPO / "README.md").read_text()


def test_make_help_says_what_the_demo_runs() -> None:
    listed = subprocess.run(
        ["make", "-s", "--no-print-directory", "help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (line,) = [line for line in listed.splitlines() if line.split()[:1] == ["demo"]]
    assert line.split(None, 1)[1] == DEMO


def test_gangcheck_dev_help_says_what_the_demo_runs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert DEMO in _words(capsys.readouterr().out)


def test_the_demo_runs_three_gangs_two_kueue_jobs_and_a_pod_group() -> None:
    assert "three GPU gangs: two Kueue Jobs" in DEMO and "and a PodGroup" in DEMO
    assert len(demo.GANGS) == 3 and len(demo.JOB_GANGS) == 2
    assert demo.pod_group()["spec"]["schedulingPolicy"]["gang"]["minCount"] == demo.MEMBERS


def test_the_hints_name_kueues_workloads_by_group() -> None:
    hints = demo.explore_hints(Path("/state/kubeconfig"), Path("/cache/kubectl"), 41002)
    (get,) = [line for line in hints.splitlines() if " get " in line]
    kinds = get.split(" get ")[1].split()[0].split(",")
    assert (
        f"{WORKLOAD.plural}.{WORKLOAD.group}" in kinds
    )  # a bare "workloads" is scheduling.k8s.io's
    assert f"{PROVISIONING_REQUEST.plural}.{PROVISIONING_REQUEST.group}" in kinds
    assert f"{UPSTREAM_POD_GROUP_V1BETA1.plural}.{UPSTREAM_POD_GROUP_V1BETA1.group}" in kinds
    assert all("." in kind for kind in kinds if kind != "nodes")
    assert "export KUBECONFIG=/state/kubeconfig" in hints


def test_dev_up_takes_the_stacks_the_docs_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["dev", "up", "--help"])
    assert exited.value.code == 0
    text = _words(capsys.readouterr().out)
    assert "--stack {full,karpenter,minimal}" in text and "--node-groups FILE" in text
    docs = (REPO / "docs" / "testbed.md").read_text()
    assert "gangcheck-dev dev up --stack full" in docs and "--stack karpenter" in docs


def test_a_demo_interrupted_says_how_to_remove_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C during `make demo` (the stack starting, the gangs running): before, a
    KeyboardInterrupt traceback and nothing said of the stack left running."""

    def interrupted(*_: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "up", interrupted)
    assert main(["demo", "up"]) == 130
    said = capsys.readouterr().err
    assert "interrupted" in said and "make demo-down" in said
