"""`gangcheck diagnose TARGET` and `gangcheck status`: read the cluster, say what blocks a gang.

A gang is a Kueue Workload or a PodGroup (either API). This package fetches (``fetch``, with
``Kube``) and renders (``text``, ``as_json``; the reports in ``reports``, the command line in
``command``); ``gangcheck.logic.workloads.diagnosis`` and
``gangcheck.logic.podgroups.group_diagnosis`` judge (an attempt served with NodeClaims:
``gangcheck.logic.sources.karpenter.explain`` says what its claims say). The
entry points ``main_diagnose`` and ``main_status`` take their own arguments (``TARGET``,
``-n``, ``--kubeconfig``, ``-o text|json``) and return the exit code: 0 when diagnosed, 1
with a one-line error on stderr when the target does not exist or is not a gang.
"""

from gangcheck.diagnose.as_json import to_json
from gangcheck.diagnose.command import main_diagnose, main_status
from gangcheck.diagnose.fetch import (
    attempt_node_claims,
    diagnose,
    diagnose_group,
    fetch_group_world,
    fetch_world,
    find_workload,
    status,
)
from gangcheck.diagnose.reports import (
    DiagnoseError,
    DiagnoseReport,
    GroupReport,
    PodGroupMember,
    Report,
    StatusReport,
)
from gangcheck.diagnose.text import render_text

__all__ = [
    "DiagnoseError",
    "DiagnoseReport",
    "GroupReport",
    "PodGroupMember",
    "Report",
    "StatusReport",
    "attempt_node_claims",
    "diagnose",
    "diagnose_group",
    "fetch_group_world",
    "fetch_world",
    "find_workload",
    "main_diagnose",
    "main_status",
    "render_text",
    "status",
    "to_json",
]
