"""`gangcheck diagnose` and `gangcheck status` on a real kube-apiserver, for gangs really stuck.

The test plays Kueue core and the cloud (as in test_fulfillment.py) while gangcheck's
controller runs; the diagnosis is read from what the API server holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from gangcheck_dev.testbed import crds
from gangcheck_dev.testbed.karpenter import KARPENTER_MODULE, KARPENTER_TOOLCHAIN

from gangcheck.diagnose import (
    diagnose,
    main_diagnose,
    main_status,
    render_text,
    status,
    to_json,
)
from gangcheck.kube.client import Kube
from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    CLUSTER_QUEUE,
    JOB,
    LEASE,
    LOCAL_QUEUE,
    NODE_CLAIM,
    POD,
    PROVISIONING_REQUEST,
    UPSTREAM_POD_GROUP_V1BETA1,
    WORKLOAD,
)
from gangcheck.logic.attempt import naming
from gangcheck.logic.podgroups import podgroup
from gangcheck.logic.podgroups.podgroup import PROVISIONING
from gangcheck.logic.sources.karpenter.claims import ClaimAsk, claim_bodies
from gangcheck.model.names import (
    CHECK_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    STATE_ANNOTATION,
    WORKLOAD_ANNOTATION,
    WORKLOAD_UID_ANNOTATION,
)
from gangcheck.model.podgroups import pod_group_of
from gangcheck.model.provisioning_config import KARPENTER_CLASS
from tests.builders import WorkloadBuilder, container, node_pool, pod_template
from tests.integration.harness import Cluster, RunningController, eventually, now

pytestmark = pytest.mark.integration

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
KUEUE_QUOTA = (
    "couldn't assign flavors to pod set workers: insufficient unused quota for nvidia.com/gpu "
    "in flavor {flavor}, 8 more needed"
)


def fit(deadline: int) -> dict[str, Any]:
    return {
        "fulfillment": {"mode": "NodesFit", "deadlineSeconds": deadline, "reclaimer": "DeleteNode"},
        "retryStrategy": {"backoffLimitCount": 3, "backoffBaseSeconds": 10},
    }


def gang(name: str = "wl", members: int = 2) -> WorkloadBuilder:
    return (
        WorkloadBuilder(name)
        .pod_set("workers", members, pod_template(gpu=1))
        .reserve_quota()
        .check()
    )


async def create_job(cluster: Cluster, name: str, *, queue: bool = True) -> dict[str, Any]:
    """A suspended batch/v1 Job, as a user submits it to Kueue (no job controller runs here)."""
    labels = {"kueue.x-k8s.io/queue-name": "lq"} if queue else {}
    body = {
        "metadata": {"name": name, "namespace": cluster.ns, "labels": labels},
        "spec": {
            "suspend": True,
            "parallelism": 2,
            "completions": 2,
            "template": {
                "spec": {"containers": [container(gpu=1)], "restartPolicy": "Never"},
            },
        },
    }
    return await cluster.kube.create(JOB, body)


def owned_by(builder: WorkloadBuilder, job: dict[str, Any]) -> WorkloadBuilder:
    """The Workload as Kueue's job controller names and owns it."""
    meta = job["metadata"]
    builder.obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    builder.obj["metadata"]["labels"] = {"kueue.x-k8s.io/job-uid": meta["uid"]}
    return builder


async def verdict_of(kube: Kube, target: str, wanted: str | re.Pattern[str]) -> str:
    """The verdict line, once it says what the test expects."""

    async def probe() -> str | None:
        line = (await diagnose(kube, target)).verdict.line
        matched = wanted.fullmatch(line) if isinstance(wanted, re.Pattern) else line == wanted
        return line if matched else None

    return await eventually(probe, timeout=15, what=f"verdict {wanted!r}")


async def run_cli(main: Any, argv: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    """Run a CLI entry point (it owns its event loop) in a thread; (code, stdout, stderr)."""
    code = await asyncio.to_thread(main, argv)
    out, err = capsys.readouterr()
    return code, out, err


async def test_arrived_nodes_with_an_untolerated_taint_name_the_taint(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(fit(deadline=120))
    job = await create_job(cluster, "train")
    workload = "job-train-5c2f1"
    await cluster.submit(owned_by(gang(workload), job))
    request = naming.request_name(workload, cluster.check, 1)
    await cluster.set_request_conditions(request, {"Accepted": "", "Provisioned": "resize done"})
    await cluster.add_nodes(3, taints=[GPU_TAINT])

    wanted = re.compile(
        r"blocked: 3 nodes arrived, none usable: 0 of 2 members placeable; 3 nodes can take "
        r"none: 3 × taint nvidia\.com/gpu:NoSchedule not tolerated; "  # noqa: RUF001
        r"node \S+: taint nvidia\.com/gpu=present:NoSchedule not tolerated"
    )
    line = await verdict_of(cluster.kube, f"job/{cluster.ns}/train", wanted)
    report = await diagnose(cluster.kube, f"workload/{cluster.ns}/{workload}")
    assert report.verdict.line == line
    placement = report.facts.placement
    assert placement is not None and len(placement.arrived) == 3
    text = render_text(report)
    assert "taint nvidia.com/gpu=present:NoSchedule not tolerated" in text
    assert text.rstrip().endswith(line)
    # the report fits 100 columns but for its last line, the verdict: one line, whatever its
    # length, as `gangcheck status` shows it (it says the fit in the check message's words)
    assert max(len(row) for row in text.splitlines()[:-1]) <= 100


async def test_exhausted_quota_quotes_kueue(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(fit(deadline=120))
    cq = f"cq-{cluster.ns}"
    await cluster.kube.create(CLUSTER_QUEUE, _cluster_queue(cq, cluster))
    try:
        await cluster.kube.create(
            LOCAL_QUEUE,
            {"metadata": {"name": "lq", "namespace": cluster.ns}, "spec": {"clusterQueue": cq}},
        )
        await cluster.submit(gang(members=16), reserve=False)
        message = KUEUE_QUOTA.format(flavor=cluster.flavor)

        def as_kueue(wl: dict[str, Any]) -> None:  # the scheduler, finding no room
            wl["status"]["conditions"] = [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": message,
                    "lastTransitionTime": now(),
                }
            ]

        await cluster.update_status("wl", as_kueue)
        await verdict_of(
            cluster.kube,
            f"workload/{cluster.ns}/wl",
            f"blocked: quota: ClusterQueue {cq}: {message}",
        )
    finally:
        with contextlib.suppress(NotFoundError):
            await cluster.kube.delete(CLUSTER_QUEUE, cq)


def _cluster_queue(name: str, cluster: Cluster) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": cluster.flavor,
                            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "8"}],
                        }
                    ],
                }
            ],
            "admissionChecksStrategy": {"admissionChecks": [{"name": cluster.check}]},
        },
    }


async def test_partial_delivery_says_how_many_members_fit_and_the_deadline(
    cluster: Cluster, controller: RunningController, capsys: pytest.CaptureFixture[str]
) -> None:
    await cluster.install_check(fit(deadline=120))
    job = await create_job(cluster, "big")
    workload = "job-big-0a1b2"
    await cluster.submit(owned_by(gang(workload, members=16), job))
    request = naming.request_name(workload, cluster.check, 1)
    await cluster.set_request_conditions(request, {"Provisioned": ""})
    await cluster.add_nodes(11)
    member = {
        "metadata": {
            "name": "big-0",
            "namespace": cluster.ns,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "big",
                    "uid": job["metadata"]["uid"],
                }
            ],
        },
        "spec": {"containers": [container(gpu=1)], "restartPolicy": "Never"},
    }
    await cluster.kube.create(POD, member)

    waiting = re.compile(
        r"blocked: waiting for the autoscaler: 11 of 16 members placeable on 11 nodes; the nodes "
        r"in use have no room for the rest, deadline in 1m[0-9]+s"
    )
    await verdict_of(cluster.kube, f"pod/{cluster.ns}/big-0", waiting)

    listed = await status(cluster.kube, cluster.ns)
    (row,) = listed.gangs
    assert (row.name, row.phase, row.arrived, row.needed, row.attempt) == (
        workload,
        "fulfilling",
        11,
        16,
        1,
    )
    assert re.search(rf"{workload}\s.*fulfilling\s+1\s+\S+\s+11/16\s+11/16", render_text(listed))

    kubeconfig = controller.kubeconfig
    code, out, err = await run_cli(
        main_status, ["-n", cluster.ns, "--kubeconfig", kubeconfig, "-o", "json"], capsys
    )
    assert (code, err) == (0, "")
    items = json.loads(out)["items"]
    assert [(i["name"], i["nodesArrived"], i["nodesNeeded"]) for i in items] == [(workload, 11, 16)]
    assert to_json(listed)["items"][0]["phase"] == "fulfilling"

    code, out, err = await run_cli(
        main_diagnose, [f"job/{cluster.ns}/big", "--kubeconfig", kubeconfig, "-o", "json"], capsys
    )
    assert (code, err) == (0, "")
    parsed = json.loads(out)
    assert waiting.fullmatch(parsed["verdict"]["line"])
    assert parsed["nodes"]["placeable"] == 11 and len(parsed["nodes"]["arrived"]) == 11


async def test_an_inactive_check_says_why(cluster: Cluster, controller: RunningController) -> None:
    await cluster.install_check(None)  # the config it points at does not exist
    await cluster.submit(gang())
    await verdict_of(
        cluster.kube,
        f"workload/{cluster.ns}/wl",
        f"blocked: the AdmissionCheck {cluster.check} is inactive: "
        f"AtomicProvisioningConfig '{cluster.config}' not found",
    )
    active = await cluster.active_condition()
    assert active is not None and active["status"] == "False"


async def test_a_missing_target_exits_1_with_one_line(
    cluster: Cluster, control_plane: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [f"job/{cluster.ns}/nope", "--kubeconfig", str(control_plane.kubeconfig)]
    code, out, err = await run_cli(main_diagnose, argv, capsys)
    assert (code, out) == (1, "")
    assert err == f"gangcheck: Job {cluster.ns}/nope not found\n"


async def test_a_job_without_a_workload_is_not_a_gang(
    cluster: Cluster, control_plane: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    await create_job(cluster, "plain", queue=False)
    argv = [f"job/{cluster.ns}/plain", "--kubeconfig", str(control_plane.kubeconfig)]
    code, out, err = await run_cli(main_diagnose, argv, capsys)
    assert (code, out) == (1, "")
    assert err.startswith(f"gangcheck: Job {cluster.ns}/plain is not a gang:")
    assert err.count("\n") == 1


async def test_status_with_nothing_in_flight_says_so(
    cluster: Cluster, control_plane: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["-n", cluster.ns, "--kubeconfig", str(control_plane.kubeconfig)]
    code, out, _ = await run_cli(main_status, argv, capsys)
    assert (code, out) == (0, f"No gangs in flight in namespace {cluster.ns}.\n")


async def test_a_controller_whose_lease_went_stale_is_said_first(
    cluster: Cluster, control_plane: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """gangcheck uninstalled or stopped mid-flight leaves its gangs as they were, and status and
    diagnose would describe what it would do as if it ran: they say first that it does not,
    from its leader Lease (not renewed for its duration plus a grace), and say nothing of it
    when the Lease is renewed or not there."""
    kubeconfig = str(control_plane.kubeconfig)
    argv = ["-n", cluster.ns, "--kubeconfig", kubeconfig, "--lease", f"{cluster.ns}/gc"]
    nobody = f"No gangs in flight in namespace {cluster.ns}.\n"
    code, out, _ = await run_cli(main_status, argv, capsys)
    assert (code, out) == (0, nobody)  # no Lease: nothing can be told
    renewed = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(time.time() - 600))
    lease = {
        "metadata": {"name": "gc", "namespace": cluster.ns},
        "spec": {"holderIdentity": "gc-0", "leaseDurationSeconds": 15, "renewTime": renewed},
    }
    await cluster.kube.create(LEASE, lease)
    code, out, _ = await run_cli(main_status, argv, capsys)
    assert code == 0
    head, _, rest = out.partition("\n\n")
    assert head.startswith(f"WARNING\n  gangcheck down: its Lease {cluster.ns}/gc last renewed 6")
    assert "no gangcheck acts on these gangs now" in " ".join(head.split())
    assert rest == nobody
    code, out, _ = await run_cli(main_status, [*argv, "-o", "json"], capsys)
    assert json.loads(out)["controllerDown"].startswith("gangcheck down: its Lease")
    await create_job(cluster, "idle", queue=False)
    code, out, err = await run_cli(main_diagnose, [f"job/{cluster.ns}/idle", *argv[2:]], capsys)
    assert code == 1 and "is not a gang" in err  # a target that cannot be diagnosed: no report
    fresh = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    patch = {"spec": {"renewTime": fresh}}
    await cluster.kube.merge_patch(LEASE, "gc", patch, cluster.ns)
    code, out, _ = await run_cli(main_status, argv, capsys)
    assert (code, out) == (0, nobody)
    code, out, err = await run_cli(main_status, [*argv[:-1], "gc"], capsys)
    assert (code, out) == (1, "")
    assert err == "gangcheck: --lease 'gc': expected NAMESPACE/NAME\n"


# ---- a Karpenter attempt's NodeClaims --------------------------------------------------

CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NODE_CLAIM_CRD = f"{CRD_API}/nodeclaims.karpenter.sh"
NOT_SERVED = "NodeClaims are not served here: Karpenter's CRDs are not installed"


def _wait_crd_gone(admin: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while admin.request("GET", NODE_CLAIM_CRD).status != 404:
        if time.monotonic() > deadline:
            raise TimeoutError("the NodeClaim CRD is still there")
        time.sleep(0.1)


@contextlib.contextmanager
def node_claim_crd(control_plane: Any, *, installed: bool) -> Iterator[None]:
    """Karpenter's own NodeClaim CRD (from the module the test bed pins; only that CRD)
    installed, or no NodeClaim CRD at all; as it was again afterwards (another test module
    may have installed its own test CRD of the same name)."""
    admin = control_plane.client()
    found = admin.request("GET", NODE_CLAIM_CRD)
    before = found.json() if found.status == 200 else None
    if before is not None:
        admin.request("DELETE", NODE_CLAIM_CRD)
        _wait_crd_gone(admin)
    if installed:
        module = crds.module_dir(
            KARPENTER_MODULE, wrapper="karpenter", toolchain=KARPENTER_TOOLCHAIN
        )
        path = module / "kwok" / "charts" / "crds" / "karpenter.sh_nodeclaims.yaml"
        crds.install_crds(admin, crds.load_crds([path]))
    try:
        yield
    finally:
        if installed:
            admin.request("DELETE", NODE_CLAIM_CRD)
            _wait_crd_gone(admin)
        if before is not None:
            meta = before["metadata"]
            again = {
                "apiVersion": before["apiVersion"],
                "kind": before["kind"],
                "metadata": {"name": meta["name"], "labels": meta.get("labels") or {}},
                "spec": before["spec"],
            }
            crds.install_crds(admin, [again])


@pytest.fixture
def karpenter_crd(control_plane: Any) -> Iterator[None]:
    with node_claim_crd(control_plane, installed=True):
        yield


@pytest.fixture
def no_karpenter_crd(control_plane: Any) -> Iterator[None]:
    with node_claim_crd(control_plane, installed=False):
        yield


async def karpenter_attempt(cluster: Cluster) -> tuple[str, str]:
    """A reserved 2-member gang whose attempt 1 has a Karpenter-class request, Accepted (no
    controller runs: the test plays gangcheck's Karpenter provisioner); (workload, request)."""
    karpenter = {"backend": "Karpenter", "karpenter": {"nodePools": ["gpu"]}}
    await cluster.install_check({**fit(deadline=120), **karpenter})
    check = await cluster.kube.get(ADMISSION_CHECK, cluster.check)
    check["status"] = {"conditions": [_condition("Active", "True", "Active")]}
    await cluster.kube.replace(ADMISSION_CHECK, check, subresource="status")
    workload = await cluster.submit(gang("wl", members=2))
    request = naming.request_name(workload, cluster.check, 1)
    uid = (await cluster.kube.get(WORKLOAD, workload, cluster.ns))["metadata"]["uid"]
    made_for = {WORKLOAD_ANNOTATION: workload, CHECK_ANNOTATION: cluster.check}
    await karpenter_request(cluster, request, {**made_for, WORKLOAD_UID_ANNOTATION: uid})
    return workload, request


async def karpenter_request(
    cluster: Cluster, request: str, made_for: dict[str, str] | None = None
) -> None:
    """A 2-member request of gangcheck's Karpenter class, Accepted as its provisioner does;
    `made_for`: the annotations gangcheck puts on a request it makes for a Workload's check
    (the diagnosis replays the controller's decision, which counts only those)."""
    body = {
        "metadata": {
            "name": request,
            "namespace": cluster.ns,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": made_for or {},
        },
        "spec": {
            "provisioningClassName": KARPENTER_CLASS,
            "parameters": {"nodePools": "gpu"},
            "podSets": [{"podTemplateRef": {"name": f"{request}-workers"}, "count": 2}],
        },
    }
    await cluster.kube.create(PROVISIONING_REQUEST, body, cluster.ns)
    await cluster.set_request_conditions(request, {"Accepted": "created 2 NodeClaims"})


#: The NodePool's one requirement, which its NodeClaims carry too.
ON_DEMAND = {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}


def _condition(kind: str, status: str, reason: str, message: str = "") -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now(),
    }


async def create_claims(cluster: Cluster, request: str) -> list[str]:
    """Two NodeClaims labelled for the attempt, as the provisioner makes them: the first
    Initialized with a node, the second Launched=False (InsufficientCapacity)."""
    ask = ClaimAsk(f"{cluster.ns}/{request}", 2, {"nvidia.com/gpu": "1"}, cluster.pool)
    names = []
    statuses = [
        {
            "nodeName": f"{cluster.ns}-n0",
            "conditions": [
                _condition("Launched", "True", "Launched"),
                _condition("Registered", "True", "Registered"),
                _condition("Initialized", "True", "Initialized"),
            ],
        },
        {
            "conditions": [
                _condition("Launched", "False", "InsufficientCapacity", "no offering left"),
            ]
        },
    ]
    pool = node_pool("gpu", uid="u-gpu", requirements=[ON_DEMAND])
    for body, state in zip(claim_bodies(pool, ask), statuses, strict=True):
        body["metadata"].pop("ownerReferences")  # no such NodePool here
        created = await cluster.kube.create(NODE_CLAIM, body)
        created["status"] = state
        await cluster.kube.replace(NODE_CLAIM, created, subresource="status")
        names.append(str(created["metadata"]["name"]))
    return names


async def test_a_karpenter_attempt_shows_its_node_claims(
    cluster: Cluster,
    control_plane: Any,
    karpenter_crd: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    workload, request = await karpenter_attempt(cluster)
    first, second = await create_claims(cluster, request)
    summary = f"1 of 2 NodeClaims arrived; {second}: InsufficientCapacity: no offering left"

    report = await diagnose(cluster.kube, f"workload/{cluster.ns}/{workload}")
    assert report.claims is not None and report.claims.summary == summary
    lines = render_text(report).splitlines()
    at = lines.index(f"claims    {summary}")
    assert lines[at + 1].split() == ["NAME", "NODEPOOL", "PHASE", "NODE"]
    assert lines[at + 2].split() == [first, "gpu", "Initialized", f"{cluster.ns}-n0"]
    assert lines[at + 3].split() == [second, "gpu", "LaunchFailing", "-"]
    assert lines[at + 4].strip() == "InsufficientCapacity: no offering left"
    assert max(len(line) for line in lines[:-1]) <= 100, "\n".join(lines)
    # the request carries no fulfillment-deadline (the test made it): read as creation + 120 s
    waiting = f"blocked: waiting for the autoscaler: {request} accepted, not provisioned yet"
    assert re.fullmatch(rf"{re.escape(waiting)}, deadline in (1m)?[0-9]+s", lines[-1]), lines[-1]

    argv = [f"workload/{cluster.ns}/{workload}", "--kubeconfig", str(control_plane.kubeconfig)]
    code, out, err = await run_cli(main_diagnose, [*argv, "-o", "json"], capsys)
    assert (code, err) == (0, "")
    claims = json.loads(out)["nodeClaims"]
    assert (claims["readable"], claims["asked"], claims["arrived"]) == (True, 2, 1)
    assert claims["summary"] == summary
    assert [(c["name"], c["nodePool"], c["phase"], c["node"]) for c in claims["claims"]] == [
        (first, "gpu", "Initialized", f"{cluster.ns}-n0"),
        (second, "gpu", "LaunchFailing", None),
    ]
    assert claims["claims"][1]["message"] == "InsufficientCapacity: no offering left"

    listed = await status(cluster.kube, cluster.ns)
    (row,) = listed.gangs
    assert (row.name, row.claims_arrived, row.claims_asked, row.nodes_cell) == (
        workload,
        1,
        2,
        "1/2 claims",
    )
    code, out, _ = await run_cli(main_status, ["-n", cluster.ns, *argv[1:], "-o", "json"], capsys)
    (item,) = json.loads(out)["items"]
    assert (code, item["nodeClaimsArrived"], item["nodeClaimsAsked"]) == (0, 1, 2)


async def test_without_karpenters_crds_node_claims_are_not_readable_not_an_error(
    cluster: Cluster,
    control_plane: Any,
    no_karpenter_crd: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    workload, _ = await karpenter_attempt(cluster)
    argv = [f"workload/{cluster.ns}/{workload}", "--kubeconfig", str(control_plane.kubeconfig)]
    code, out, err = await run_cli(main_diagnose, argv, capsys)
    assert (code, err) == (0, "")
    section = out[out.index("\nclaims    ") + 1 : out.index("\n\n", out.index("\nclaims    "))]
    assert " ".join(section.split()) == f"claims NodeClaims: not readable ({NOT_SERVED})"

    code, out, err = await run_cli(main_diagnose, [*argv, "-o", "json"], capsys)
    assert (code, err) == (0, "")
    claims = json.loads(out)["nodeClaims"]
    assert (claims["readable"], claims["problem"], claims["claims"]) == (False, NOT_SERVED, [])

    listed = await status(cluster.kube, cluster.ns)
    (row,) = listed.gangs
    assert (row.name, row.claims_asked) == (workload, None)


async def test_a_podgroups_karpenter_attempt_shows_its_node_claims(
    cluster: Cluster,
    control_plane: Any,
    karpenter_crd: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    body = {
        "metadata": {
            "name": "train",
            "namespace": cluster.ns,
            "annotations": {STATE_ANNOTATION: PROVISIONING},
        },
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
    }
    group = pod_group_of(await cluster.kube.create(UPSTREAM_POD_GROUP_V1BETA1, body))
    request = podgroup.request_name(group, 1)
    await karpenter_request(cluster, request)
    first, second = await create_claims(cluster, request)

    argv = [f"podgroup/{cluster.ns}/train", "--kubeconfig", str(control_plane.kubeconfig)]
    code, out, err = await run_cli(main_diagnose, argv, capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    at = lines.index(
        f"claims    1 of 2 NodeClaims arrived; {second}: InsufficientCapacity: no offering left"
    )
    assert lines[at + 2].split() == [first, "gpu", "Initialized", f"{cluster.ns}-n0"]
    assert lines[at + 3].split() == [second, "gpu", "LaunchFailing", "-"]

    code, out, err = await run_cli(main_diagnose, [*argv, "-o", "json"], capsys)
    assert (code, err) == (0, "")
    claims = json.loads(out)["nodeClaims"]
    assert [(c["name"], c["phase"]) for c in claims["claims"]] == [
        (first, "Initialized"),
        (second, "LaunchFailing"),
    ]


async def test_a_gang_requeued_after_a_rollback_says_why_from_the_workloads_events(
    cluster: Cluster, controller: RunningController
) -> None:
    """The attempt rolls back at its deadline (nothing asked for arrives): the check turns
    Retry with why. Kueue (played here as v0.17 does it) evicts the Workload in the same
    moment, resets the check to Pending ('Reset to Pending after eviction. Previously:
    Retry') and requeues it on backoff: the check no longer says why. diagnose and status
    read it from gangcheck's AdmissionCheckUpdated Event on the Workload."""
    await cluster.install_check(fit(deadline=1))
    await cluster.submit(gang())
    retry = await cluster.wait_check("wl", "Retry")
    assert retry["message"].startswith("Retrying after rollback: rolled back wl-")
    requeue_at = time.time() + 600

    def as_kueue(wl: dict[str, Any]) -> None:  # workload.Evict, then the requeue backoff
        st = wl["status"]
        st.pop("admission", None)
        st["conditions"] = [
            c for c in st.get("conditions") or [] if c["type"] not in ("QuotaReserved", "Evicted")
        ] + [
            {"type": t, "status": s, "reason": r, "message": m, "lastTransitionTime": now()}
            for t, s, r, m in (
                ("QuotaReserved", "False", "Pending", "evicted"),
                ("Evicted", "True", "AdmissionCheck", "At least one admission check is false"),
            )
        ]
        st["admissionChecks"] = [
            {
                "name": cluster.check,
                "state": "Pending",
                "message": "Reset to Pending after eviction. Previously: Retry",
                "retryCount": 1,
                "lastTransitionTime": now(),
            }
        ]
        st["requeueState"] = {
            "count": 1,
            "requeueAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(requeue_at)),
        }

    await cluster.update_status("wl", as_kueue)
    said = re.escape(f"the check {cluster.check} turned Retry: {retry['message']}")
    backoff = "blocked: backoff after attempt 1: Kueue requeues the Workload in"
    wanted = re.compile(rf"{backoff} \S+; {said}")
    await verdict_of(cluster.kube, f"workload/{cluster.ns}/wl", wanted)
    report = await diagnose(cluster.kube, f"workload/{cluster.ns}/wl")
    ended = to_json(report)["checkEnded"]
    assert (ended["state"], ended["message"]) == ("Retry", retry["message"])
    assert f"Retry at {ended['at']}: " in render_text(report)
    (row,) = (await status(cluster.kube, cluster.ns)).gangs
    assert wanted.fullmatch(row.verdict), row.verdict  # its countdown read a moment later
