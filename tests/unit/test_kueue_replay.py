"""Kueue's own provisioning tests, replayed against gangcheck's pure decision.

Every case of Kueue's `pkg/controller/admissionchecks/provisioning/controller_test.go`,
`admissioncheck_reconciler_test.go` and of the integration suite
`test/integration/singlecluster/controller/admissionchecks/provisioning/provisioning_test.go`
(v0.17.0, plus what v0.19.2 added) that concerns the check's behaviour: which request is
created, kept or deleted, which check state and message, which podSetUpdates, and the
AdmissionCheck's Active condition. Each is replayed on `decide()` in `TrustProvisioned` mode
(Kueue's meaning of Ready) and classified:

- ``match``: gangcheck does what Kueue's case expects;
- ``by-design``: gangcheck differs on purpose; the reason is in docs/kueue-differences.md;
- ``differs``: a real difference, asserted as it is today and reported.

Where the test plays Kueue core (eviction, requeue, the reset to Pending) or the autoscaler
(request conditions), a step's Scene writes those records by hand, as Kueue's integration
suite does. How cases are compared (a message with the same facts is the same; labels naming
the manager are not counted; ``only_message`` marks a by-design case whose decision is
Kueue's) is in docs/kueue-differences.md, "Replay of Kueue's tests", whose counts
`test_the_documented_replay_counts_are_the_table_s` keeps true.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.actions import (
    CreateRequest,
    CreateTemplate,
    DeleteRequest,
)
from gangcheck.logic.workloads import checkconfig
from gangcheck.logic.workloads.admission import Decision, Snapshot, decide
from gangcheck.model.objects import Flavor, request_of, workload_of
from gangcheck.model.provisioning_config import parse_spec
from gangcheck.reconcile.apply import made_for
from tests.builders import T0, WorkloadBuilder, provisioning_request

Obj = dict[str, Any]

# ---- the one builder of snapshots: the only code here that knows Snapshot's fields -------

NOW = datetime(2026, 11, 30, 10, 5, tzinfo=UTC)
CHECK = "check1"  # controller_test.go's check
AC = "ac-prov"  # the integration suite's check
FLAVORS = {
    "flv1": Flavor(
        "flv1",
        {"f1l1": "v1"},
        ({"key": "f1t1k", "value": "f1t1v", "operator": "Equal", "effect": "NoSchedule"},),
    ),
    "flv2": Flavor("flv2", {"f2l1": "v1"}, ()),
    "on-demand": Flavor("on-demand", {"ns1": "ns1v"}, ()),
    "flavor-1": Flavor("flavor-1", {"ns1": "ns1v"}, ()),
    "flavor-2": Flavor("flavor-2", {"ns2": "ns2v"}, ()),
}


@dataclass(frozen=True)
class Scene:
    """What the caches hold for one Workload and one check, as a test writes it."""

    workload: Obj
    config: Mapping[str, Any] | None
    check: str = CHECK
    requests: tuple[Obj, ...] = ()
    templates: tuple[str, ...] | None = None
    """PodTemplates that exist (owned by the Workload); None: each request's own."""
    config_problem: str = "ProvisioningRequestConfig 'config1' not found"


def snapshot(scene: Scene) -> Snapshot:
    requests = tuple(request_of(r) for r in scene.requests)
    names = (
        scene.templates
        if scene.templates is not None
        else tuple(p.template_name for r in requests for p in r.pod_sets)
    )
    return Snapshot(
        workload=workload_of(scene.workload),
        check=scene.check,
        config=None if scene.config is None else parse_spec(dict(scene.config)),
        config_problem=scene.config_problem,
        flavors=FLAVORS,
        requests=requests,
        templates=frozenset(names),
    )


def decide_in(scene: Scene) -> Decision:
    return decide(snapshot(scene), NOW)


# ---- Kueue's fixtures, in gangcheck's terms ------------------------------------------------

TRUST: Obj = {"fulfillment": {"mode": "TrustProvisioned"}}


def config(class_name: str = "class1", retry: int | None = 3, base: int = 60, **extra: Any) -> Obj:
    """A config as Kueue's tests write a ProvisioningRequestConfig (TrustProvisioned)."""
    out: Obj = {
        **TRUST,
        "provisioningClassName": class_name,
        "allowCustomProvisioningClass": True,
        **extra,
    }
    if retry is not None:
        out["retryStrategy"] = {
            "backoffLimitCount": retry,
            "backoffBaseSeconds": base,
            "backoffMaxSeconds": max(base, 1800),
        }
    return out


BASE_CONFIG = config(parameters={"p1": "v1"})  # baseConfigWithRetryStrategy
SUITE_CONFIG = config("provisioning-class", retry=0, parameters={"p1": "v1", "p2": "v2"})
SUITE_CONFIG2 = config("provisioning-class2", retry=0, parameters={"p1": "v1.2", "p2": "v2.2"})


def template(priority: str = "", **requests: str) -> Obj:
    """A pod template with one container `c` requesting `requests` (underscores: dots)."""
    res = {k.replace("__", "/").replace("_", "."): v for k, v in requests.items()}
    spec: Obj = {"containers": [{"name": "c", "resources": {"requests": res}}]}
    if priority:
        spec["priorityClassName"] = priority
    return {"spec": spec}


@dataclass(frozen=True)
class PS:
    """A pod set: name, spec count, template, assigned flavor, admitted count (None: unset,
    absent: no assignment at all)."""

    name: str
    count: int
    template: Obj = field(default_factory=lambda: template(cpu="1"))
    flavor: str = "flv1"
    admitted: int | None = -1  # -1: the spec count
    assigned: bool = True


def workload(
    *pod_sets: PS,
    checks: tuple[tuple[str, str], ...] = ((CHECK, "Pending"),),
    reserved: bool = True,
    conditions: tuple[str, ...] = (),
    retry_count: int = 0,
    message: str = "",
    annotations: Mapping[str, str] | None = None,
    active: bool = True,
    extra_assignments: tuple[str, ...] = (),
) -> Obj:
    """A Workload as Kueue's wrappers make one: pod sets, quota, conditions, check entries."""
    b = WorkloadBuilder()
    for ps in pod_sets:
        b.pod_set(ps.name, ps.count, ps.template)
    for key, value in (annotations or {}).items():
        b.annotation(key, value)
    if reserved:
        b.reserve_quota()
        b.obj["status"]["admission"]["podSetAssignments"] = [
            _assignment(ps) for ps in pod_sets if ps.assigned
        ] + [{"name": n, "flavors": {"cpu": "flv1"}, "count": 1} for n in extra_assignments]
    for kind in conditions:
        b.condition(kind)
    for i, (name, state) in enumerate(checks):  # the first is the check replayed
        b.check(
            name, state, retry_count=retry_count if i == 0 else 0, message=message if i == 0 else ""
        )
    if not active:
        b.obj["spec"]["active"] = False
    return b.build()


def _assignment(ps: PS) -> Obj:
    out: Obj = {"name": ps.name, "flavors": {"cpu": ps.flavor, "memory": ps.flavor}}
    if ps.admitted is not None:
        out["count"] = ps.count if ps.admitted == -1 else ps.admitted
    return out


def base_pod_sets() -> tuple[PS, PS]:
    """controller_test.go's baseWorkload: ps1 (4, cpu) on flv1; ps2 (4, memory, 3 admitted)
    on flv2."""
    return (
        PS("ps1", 4, template(cpu="1"), "flv1"),
        PS("ps2", 4, template(memory="1M"), "flv2", admitted=3),
    )


def base_workload(**kw: Any) -> Obj:
    kw.setdefault("checks", ((CHECK, "Pending"), ("not-provisioning", "Pending")))
    return workload(*base_pod_sets(), **kw)


def suite_workload(**kw: Any) -> Obj:
    """The integration suite's Workload: ps1 3 (cpu), ps2 6 (cpu, example.com/gpu) with 3 and
    4 admitted on flavor on-demand, and the ValidUntilSeconds provreq annotation."""
    gpu = template(cpu="500m", example_com__gpu="1")
    kw.setdefault("checks", ((AC, "Pending"),))
    kw.setdefault(
        "annotations",
        {"provreq.kueue.x-k8s.io/ValidUntilSeconds": "0", "invalid-provreq-prefix/Foo": "Bar"},
    )
    return workload(
        PS("ps1", 3, template(cpu="1"), "on-demand"),
        PS("ps2", 6, gpu, "on-demand", admitted=4),
        **kw,
    )


def request(
    name: str = "wl-check1-1",
    *,
    pod_sets: tuple[tuple[str, int], ...] | None = None,
    conditions: tuple[tuple[str, str, str], ...] = (),
    class_name: str = "class1",
    parameters: Mapping[str, str] | None = None,
    check: str = CHECK,
    details: Mapping[str, str] | None = None,
) -> Obj:
    """A request of ours, as the autoscaler left it: (type, status, message) conditions."""
    if pod_sets is None:
        pod_sets = ((naming.template_name(name, "ps1"), 4), (naming.template_name(name, "ps2"), 3))
    obj = provisioning_request(
        name,
        class_name=class_name,
        templates=list(pod_sets),
        parameters=dict({"p1": "v1"} if parameters is None else parameters),
        annotations={"gangcheck.io/check": check},
    )
    obj["status"]["conditions"] = [
        {"type": t, "status": s, "reason": t, "message": m, "lastTransitionTime": T0}
        for t, s, m in conditions
    ]
    if details:
        obj["status"]["provisioningClassDetails"] = dict(details)
    return obj


BASE_REQUEST = request()
PROVISIONED = ("Provisioned", "True", "By test")
ACCEPTED = ("Accepted", "True", "")


def failed(message: str = "By test") -> tuple[str, str, str]:
    return ("Failed", "True", message)


def expired(message: str = "") -> tuple[str, str, str]:
    return ("BookingExpired", "True", message)


REVOKED = ("CapacityRevoked", "True", "")


# ---- what a step must decide ---------------------------------------------------------------

ANY = object()


@dataclass(frozen=True)
class Want:
    state: str | None = None
    """The check state written; None: no check write."""
    message: str | None = None
    """The written message starts with this; None: not asserted."""
    requeue: Any = ANY
    creates: tuple[str, ...] = ()
    pod_sets: tuple[tuple[str, int], ...] | None = None
    """The created request's (template, count)s."""
    class_name: str | None = None
    parameters: Mapping[str, str] | None = None
    templates: tuple[str, ...] | None = None
    """The PodTemplates created, in order."""
    deletes: tuple[str, ...] = ()
    updates: Mapping[str, str] | None = None
    """Pod set -> the request its pods consume; None: podSetUpdates not asserted."""
    node_selector: Mapping[str, str] | None = None
    """Every podSetUpdate's nodeSelector (empty: none)."""
    events: tuple[str, ...] | None = None
    template_has: Mapping[str, Mapping[str, Any]] | None = None
    """Created template -> {"nodeSelector"|"requests"|"tolerations"|"priorityClassName": …}."""
    taken_by: Obj | None = None
    """An object already holding the created request's name (AlreadyExists on create)."""
    taken_is_ours: bool = False
    """Whether that object counts as created (ours) or is reported as a collision."""
    template_owners: tuple[tuple[str, bool], ...] | None = None
    """Every created template's owners: (kind, controller)."""
    writes_check_only: bool = False
    """No action at all: nothing is written but the check (no template handed over)."""


def check_step(d: Decision, want: Want) -> None:
    if want.state is None:
        assert d.check is None, d.check
    else:
        assert d.check is not None and d.check.state == want.state, d.check
        if want.message is not None:
            assert d.check.message.startswith(want.message), d.check.message
        if want.requeue is not ANY:
            assert d.check.requeue_after_seconds == want.requeue
    created = [a.body for a in d.actions if isinstance(a, CreateRequest)]
    assert [b["metadata"]["name"] for b in created] == list(want.creates)
    if want.pod_sets is not None:
        ps = created[0]["spec"]["podSets"]
        assert [(p["podTemplateRef"]["name"], p["count"]) for p in ps] == list(want.pod_sets)
    if want.class_name is not None:
        assert created[0]["spec"]["provisioningClassName"] == want.class_name
    if want.parameters is not None:
        assert created[0]["spec"]["parameters"] == dict(want.parameters)
    if want.templates is not None:
        made = [a.body["metadata"]["name"] for a in d.actions if isinstance(a, CreateTemplate)]
        assert made == list(want.templates)
    assert tuple(a.name for a in d.actions if isinstance(a, DeleteRequest)) == want.deletes
    if want.updates is not None or want.node_selector is not None:
        _check_updates(d, want)
    if want.events is not None:
        assert tuple(e.reason for e in d.events) == want.events
    if want.template_has is not None:
        _check_templates(d, want.template_has)
    if want.taken_by is not None:
        assert made_for(want.taken_by, created[0]) is want.taken_is_ours
    if want.template_owners is not None:
        for a in d.actions:
            if isinstance(a, CreateTemplate):
                refs = a.body["metadata"].get("ownerReferences") or []
                assert tuple((r["kind"], r["controller"]) for r in refs) == want.template_owners
    if want.writes_check_only:
        assert d.actions == (), d.actions


def _check_templates(d: Decision, wanted: Mapping[str, Mapping[str, Any]]) -> None:
    made = {
        a.body["metadata"]["name"]: a.body["template"]
        for a in d.actions
        if isinstance(a, CreateTemplate)
    }
    for name, fields in wanted.items():
        spec = made[name]["spec"]
        seen = {
            "nodeSelector": spec.get("nodeSelector", {}),
            "tolerations": spec.get("tolerations", []),
            "priorityClassName": spec.get("priorityClassName", ""),
            "requests": spec["containers"][0]["resources"].get("requests", {}),
        }
        assert {k: seen[k] for k in fields} == dict(fields), name


def _check_updates(d: Decision, want: Want) -> None:
    assert d.check is not None
    updates = {u["name"]: u for u in d.check.pod_set_updates}
    if want.updates is not None:
        consume = "autoscaling.x-k8s.io/consume-provisioning-request"
        assert {n: u["annotations"][consume] for n, u in updates.items()} == dict(want.updates)
        for u in updates.values():
            assert u["annotations"]["autoscaling.x-k8s.io/provisioning-class-name"]
    if want.node_selector is not None:
        for u in updates.values():
            assert u.get("nodeSelector", {}) == dict(want.node_selector)


# ---- the replay table ----------------------------------------------------------------------

MATCH, BY_DESIGN, DIFFERS = "match", "by-design", "differs"
CONTROLLER = "controller_test.go"
AC_RECONCILER = "admissioncheck_reconciler_test.go"
SUITE = "provisioning_test.go"


@dataclass(frozen=True)
class Active:
    """An AdmissionCheck, the configs that exist, and the Active condition wanted
    ((status, reason, words the message holds); None: not our check, no condition)."""

    admission_check: Obj
    configs: Mapping[str, Obj] = field(default_factory=dict)
    want: tuple[str, str, str] | None = None


@dataclass(frozen=True)
class Replay:
    source: str
    case: str
    verdict: str
    says: str
    """What gangcheck does, as a sentence."""
    steps: tuple[tuple[Scene, Want], ...] = ()
    why: str = ""
    """by-design: the reason (docs/kueue-differences.md); differs: what Kueue expects."""
    since: str = "v0.17.0"
    """The first Kueue release of the two replayed whose test has the case."""
    only_message: bool = False
    """by-design: the decision is Kueue's, only the check message differs."""
    active: Active | None = None

    @property
    def id(self) -> str:
        return f"{self.source}: {self.case} [{self.verdict}]: {self.says}"


def one(scene: Scene, want: Want) -> tuple[tuple[Scene, Want], ...]:
    return ((scene, want),)


NOT_NEEDED = "the provisioning request is not needed"
R1 = "wl-check1-1"
T1 = (naming.template_name(R1, "ps1"), naming.template_name(R1, "ps2"))
BASE_POD_SETS = ((T1[0], 4), (T1[1], 3))
BOTH_CONSUME_R1 = {"ps1": R1, "ps2": R1}
EMPTY_MESSAGE = "Kueue leaves the Pending check's message empty; gangcheck says what it did"
MESSAGE_ROW = "docs/kueue-differences.md, 'Check messages where Kueue's is empty'"
CREATED = ("ProvisioningRequestCreated",)


def base(**kw: Any) -> Scene:
    """controller_test.go's baseWorkload with baseConfigWithRetryStrategy."""
    wl = base_workload(**{k: v for k, v in kw.items() if k not in ("config", "requests")})
    return Scene(wl, kw.get("config", BASE_CONFIG), requests=tuple(kw.get("requests", ())))


def zero_counts(spec: tuple[int, ...], admitted: tuple[int | None, ...], **kw: Any) -> Obj:
    """TestMergePodSetsSkipsZeroCounts' and TestReqIsNeeded's Workload: ps0, ps1, … requesting
    one cpu each."""
    return workload(
        *(PS(f"ps{i}", c, admitted=a) for i, (c, a) in enumerate(zip(spec, admitted, strict=True))),
        **kw,
    )


MERGE_CASES = [
    Replay(
        CONTROLLER,
        "TestMergePodSetsSkipsZeroCounts/zero spec count",
        MATCH,
        "a pod set counted zero in the spec is left out of the request",
        one(
            Scene(zero_counts((0, 2), (0, 2)), config(retry=None)),
            Want("Pending", creates=(R1,), pod_sets=((naming.template_name(R1, "ps1"), 2),)),
        ),
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestMergePodSetsSkipsZeroCounts/zero admission count override",
        MATCH,
        "a pod set admitted with count zero is left out of the request",
        one(
            Scene(zero_counts((1, 2), (0, 2)), config(retry=None)),
            Want("Pending", creates=(R1,), pod_sets=((naming.template_name(R1, "ps1"), 2),)),
        ),
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestMergePodSetsSkipsZeroCounts/zero count does not block compatible merging",
        MATCH,
        "identical pod sets merge into the first one counted, skipping the zero one",
        one(
            Scene(
                zero_counts((1, 2, 3), (0, 2, 3)),
                config(retry=None, podSetMergePolicy="IdenticalPodTemplates"),
            ),
            Want("Pending", creates=(R1,), pod_sets=((naming.template_name(R1, "ps1"), 5),)),
        ),
        since="v0.19.2",
    ),
]

CPU_ONLY = config(retry=None, managedResources=["cpu"])

NEEDED_CASES = [
    Replay(
        CONTROLLER,
        "TestReqIsNeeded/positive admitted count needs request",
        MATCH,
        "a pod set admitted with a positive count gets a request",
        one(Scene(zero_counts((1,), (1,)), CPU_ONLY), Want("Pending", creates=(R1,))),
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestReqIsNeeded/missing admitted count falls back to spec count",
        MATCH,
        "an assignment without a count uses the spec count",
        one(
            Scene(zero_counts((1,), (None,)), CPU_ONLY),
            Want("Pending", creates=(R1,), pod_sets=((naming.template_name(R1, "ps0"), 1),)),
        ),
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestReqIsNeeded/zero admitted count does not need request",
        MATCH,
        "a pod set admitted with count zero needs no request: Ready, none made",
        one(Scene(zero_counts((1,), (0,)), CPU_ONLY), Want("Ready", NOT_NEEDED)),
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestReqIsNeeded/zero spec count does not require assignment",
        MATCH,
        "a pod set of count zero needs neither an assignment nor a request",
        one(
            Scene(workload(PS("ps", 0, assigned=False), extra_assignments=("main",)), CPU_ONLY),
            Want("Ready", NOT_NEEDED),
        ),
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestReqIsNeeded/missing assignment returns inconsistency error",
        BY_DESIGN,
        "an admission missing a needed pod set's assignment is reported on the check; "
        "no request is made",
        one(
            Scene(workload(PS("ps", 1, assigned=False), extra_assignments=("main",)), CPU_ONLY),
            Want("Pending", "the admission is inconsistent: no podSetAssignment for pod set ps"),
        ),
        why="Kueue returns errInconsistentPodSetAssignments from the reconcile (logged, "
        "retried, nothing on the Workload); docs/kueue-differences.md, 'An admission without "
        "an assignment'",
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestReqIsNeeded/needed podset short circuits later missing assignment",
        BY_DESIGN,
        "a later pod set without an assignment is reported even when an earlier one needs capacity",
        one(
            Scene(workload(PS("ps1", 1), PS("ps2", 1, assigned=False)), CPU_ONLY),
            Want("Pending", "the admission is inconsistent: no podSetAssignment for pod set ps2"),
        ),
        why="Kueue's reqIsNeeded answers 'needed' at ps1, then mergePodSets fails on ps2 with "
        "errInconsistentPodSetAssignments: no request either way; gangcheck says why on the "
        "check (docs/kueue-differences.md, 'An admission without an assignment')",
        since="v0.19.2",
    ),
]

FLV1_TEMPLATE = {
    "nodeSelector": {"f1l1": "v1"},
    "tolerations": [
        {"key": "f1t1k", "value": "f1t1v", "operator": "Equal", "effect": "NoSchedule"}
    ],
}
CREATED_BASE = Want(
    "Pending",
    f"provisioning request {R1} created for 7 pods",
    creates=(R1,),
    pod_sets=BASE_POD_SETS,
    class_name="class1",
    parameters={"p1": "v1"},
    templates=T1,
    template_has={T1[0]: FLV1_TEMPLATE, T1[1]: {"nodeSelector": {"f2l1": "v1"}}},
    events=CREATED,
    template_owners=(),
)
OWNERS = (
    "Kueue moves each template's controller reference from the Workload to the request, a "
    "patch per template; gangcheck's templates are owned by nothing, as its requests are not, "
    "and name the Workload's uid: no write hands them over, a request deleted by hand does "
    "not take them with it, and an attempt kept open after its Workload went still reads "
    "them (docs/kueue-differences.md, 'PodTemplates')"
)


def handed_over(scene: Scene, req: Obj) -> tuple[Scene, Want]:
    """The next reconcile: the request exists, its templates owned by the Workload; where
    Kueue hands each template to the request, gangcheck writes nothing but the check."""
    names = tuple(p["podTemplateRef"]["name"] for p in req["spec"]["podSets"])
    after = replace(scene, requests=(req,), templates=names)
    name = req["metadata"]["name"]
    return after, Want(
        "Pending", f"waiting for provisioning request {name} to be accepted", writes_check_only=True
    )


def limit_template() -> Obj:
    """ps1 of the resource-limit case: a cpu request, an example.com/gpu limit only."""
    resources = {"requests": {"cpu": "1"}, "limits": {"example.com/gpu": "1"}}
    return {"spec": {"containers": [{"name": "c", "resources": resources}]}}


def with_conditions(*conditions: tuple[str, str, str], **kw: Any) -> Obj:
    return request(conditions=conditions, **kw)


MEMORY_ONLY = base(config=config(retry=None, parameters={"p1": "v1"}, managedResources=["memory"]))
GPU_LIMIT_ONLY = Scene(
    workload(
        PS("ps1", 4, limit_template()),
        PS("ps2", 4, template(memory="1M"), "flv2", admitted=3),
    ),
    config(retry=None, parameters={"p1": "v1"}, managedResources=["example.com/gpu"]),
)
ADMITTED_PROVISIONED = (("Failed", "False", ""), ("Provisioned", "True", ""), ACCEPTED)

RECONCILE_CASES = [
    Replay(
        CONTROLLER,
        "TestReconcile/unrelated workload",
        MATCH,
        "a Workload without our check and without quota is left alone",
        one(Scene(workload(PS("main", 1), checks=(), reserved=False), BASE_CONFIG), Want()),
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/unrelated workload with reservation",
        MATCH,
        "a Workload with quota but without our check is left alone",
        one(Scene(workload(PS("main", 1), checks=()), BASE_CONFIG), Want()),
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/unrelated admitted workload",
        MATCH,
        "an admitted Workload without our check is left alone",
        one(
            Scene(workload(PS("main", 1), checks=(), conditions=("Admitted",)), BASE_CONFIG), Want()
        ),
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/missing config",
        BY_DESIGN,
        "a check without its config stays Pending, saying it is not active and why",
        one(
            base(config=None), Want("Pending", "the check is not active: ProvisioningRequestConfig")
        ),
        why="Kueue's message is exactly 'the check is not active' (CheckInactiveMessage); "
        "docs/kueue-differences.md, 'Inactive check message'",
        only_message=True,
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/with config",
        BY_DESIGN,
        "quota reserved: one request for both pod sets at their admitted counts, templates "
        "carrying the flavors' labels and tolerations",
        ((base(), CREATED_BASE), handed_over(base(), BASE_REQUEST)),
        why=f"{OWNERS}; and {EMPTY_MESSAGE}",
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/with only zero-count PodSets",
        MATCH,
        "every pod set counted zero: Ready, not needed, and the request in flight deleted",
        one(
            Scene(
                workload(
                    PS("ps1", 0, admitted=0),
                    PS("ps2", 0, template(memory="1M"), "flv2", admitted=0),
                    checks=((CHECK, "Pending"), ("not-provisioning", "Pending")),
                ),
                BASE_CONFIG,
                requests=(BASE_REQUEST,),
            ),
            Want(
                "Ready",
                NOT_NEEDED,
                deletes=(R1,),
                events=("AdmissionCheckUpdated", "ProvisioningRequestDeleted"),
            ),
        ),
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/workload with provreq annotation",
        MATCH,
        "provreq.kueue.x-k8s.io/ annotations become request parameters, others are ignored",
        one(
            Scene(
                workload(
                    PS("main", 1),
                    annotations={
                        "provreq.kueue.x-k8s.io/ValidUntilSeconds": "0",
                        "invalid-provreq-prefix/Foo1": "Bar1",
                        "another-invalid-provreq-prefix/Foo2": "Bar2",
                    },
                ),
                TRUST,
            ),
            Want(
                "Pending",
                creates=(R1,),
                parameters={"ValidUntilSeconds": "0"},
                pod_sets=((naming.template_name(R1, "main"), 1),),
                events=CREATED,
            ),
        ),
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/remove unnecessary requests",
        BY_DESIGN,
        "a request of the check that is not the attempt's is deleted and the attempt's made",
        one(
            base(requests=(request("wl-check2", pod_sets=()),)),
            Want("Pending", creates=(R1,), deletes=("wl-check2",), events=CREATED),
        ),
        why=EMPTY_MESSAGE,
        only_message=True,
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/one template already created",
        BY_DESIGN,
        "a template left by an interrupted reconcile is reused; only the missing one is made",
        (
            (
                Scene(base_workload(), BASE_CONFIG, templates=(T1[0],)),
                Want(
                    "Pending",
                    creates=(R1,),
                    pod_sets=BASE_POD_SETS,
                    templates=(T1[1],),
                    template_owners=(),
                ),
            ),
            handed_over(base(), BASE_REQUEST),
        ),
        why=f"{OWNERS}; and {EMPTY_MESSAGE}",
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/request out of sync",
        BY_DESIGN,
        "a request whose parameters no longer match the config ends the attempt (Retry); the "
        "next attempt, under a new name, uses the new config",
        one(
            base(
                requests=(
                    request(
                        pod_sets=((naming.template_name(R1, "main"), 1),), parameters={"p1": "v0"}
                    ),
                )
            ),
            Want(
                "Retry", "Retrying after config change: the request parameters changed", requeue=60
            ),
        ),
        why="Kueue deletes the request and makes a new one under the same name; "
        "docs/kueue-differences.md, 'Config class or parameters changed before Provisioned'",
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/request removed on workload finished",
        MATCH,
        "a finished Workload's request is deleted",
        one(base(conditions=("Finished",), requests=(BASE_REQUEST,)), Want(deletes=(R1,))),
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/request removed on workload evicted",
        MATCH,
        "an evicted Workload's request is deleted (Kueue v0.19's default)",
        one(base(conditions=("Evicted",), requests=(BASE_REQUEST,)), Want(deletes=(R1,))),
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/request removed on workload evicted by admission check",
        MATCH,
        "a Workload evicted because of an admission check loses its request",
        one(base(conditions=("Evicted",), requests=(BASE_REQUEST,)), Want(deletes=(R1,))),
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/request preserved on workload evicted when cleanup is disabled",
        BY_DESIGN,
        "an evicted Workload's request is deleted: gangcheck has no switch to keep it",
        one(base(conditions=("Evicted",), requests=(BASE_REQUEST,)), Want(deletes=(R1,))),
        why="Kueue keeps it with CleanupProvisioningRequestsOnEviction off (v0.17's only "
        "behaviour); docs/kueue-differences.md, 'Eviction'",
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/when retry count is preserved but provisioning request was cleaned up",
        BY_DESIGN,
        "retryCount 1 and no request: attempt 2 is made under its own name",
        one(
            base(retry_count=1),
            Want(
                "Pending",
                "provisioning request wl-check1-2 created for 7 pods",
                creates=("wl-check1-2",),
                pod_sets=(
                    (naming.template_name("wl-check1-2", "ps1"), 4),
                    (naming.template_name("wl-check1-2", "ps2"), 3),
                ),
            ),
        ),
        why=EMPTY_MESSAGE,
        only_message=True,
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/when request fails and is retried",
        MATCH,
        "a failed request under the retry limit: Retry after the base backoff, with its message",
        one(
            base(
                config=config(parameters={"p1": "v1"}, retry=2),
                requests=(with_conditions(failed()),),
            ),
            Want(
                "Retry",
                "Retrying after failure: By test",
                requeue=60,
                events=("AdmissionCheckUpdated",),
            ),
        ),
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/when request fails, and there is no retry",
        MATCH,
        "a failed request with no retry left: Rejected with the autoscaler's message",
        one(
            base(
                config=config(parameters={"p1": "v1"}, retry=0),
                requests=(with_conditions(failed()),),
            ),
            Want("Rejected", "By test", events=("AdmissionCheckUpdated",)),
        ),
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/when request is provisioned",
        MATCH,
        "a Provisioned request: Ready with its message; every pod set consumes the request",
        one(
            base(requests=(with_conditions(PROVISIONED),)),
            Want("Ready", "By test", updates=BOTH_CONSUME_R1, node_selector={}),
        ),
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/when no request is needed",
        MATCH,
        "managedResources matching no pod set: Ready, not needed, nothing made",
        one(
            base(
                config=config(
                    retry=None, parameters={"p1": "v1"}, managedResources=["example.org/gpu"]
                )
            ),
            Want("Ready", NOT_NEEDED, events=("AdmissionCheckUpdated",)),
        ),
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/when request is needed for one PodSet (resource request)",
        BY_DESIGN,
        "managedResources matching one pod set's request: the request carries that pod set only",
        (
            (
                MEMORY_ONLY,
                Want(
                    "Pending",
                    creates=(R1,),
                    pod_sets=((T1[1], 3),),
                    templates=(T1[1],),
                    template_owners=(),
                ),
            ),
            handed_over(MEMORY_ONLY, request(pod_sets=((T1[1], 3),))),
        ),
        why=f"{OWNERS}; and {EMPTY_MESSAGE}",
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/when request is needed for one PodSet (resource limit)",
        BY_DESIGN,
        "a resource named only in limits counts, and its limit is copied into the requests",
        (
            (
                GPU_LIMIT_ONLY,
                Want(
                    "Pending",
                    creates=(R1,),
                    pod_sets=((T1[0], 4),),
                    template_has={T1[0]: {"requests": {"cpu": "1", "example.com/gpu": "1"}}},
                    template_owners=(),
                ),
            ),
            handed_over(GPU_LIMIT_ONLY, request(pod_sets=((T1[0], 4),))),
        ),
        why=f"{OWNERS}; and {EMPTY_MESSAGE}",
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/when the request is removed while the check is ready; don't create the "
        "ProvReq and keep Ready state",
        MATCH,
        "a Ready check whose request is gone stays Ready; no request is made",
        one(base(checks=((CHECK, "Ready"), ("not-provisioning", "Pending"))), Want()),
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/workloads status gets updated based on the provisioning request",
        MATCH,
        "an Accepted request not yet Provisioned: Pending with the autoscaler's ETA",
        one(
            base(
                requests=(
                    with_conditions(
                        ("Failed", "False", ""),
                        (
                            "Provisioned",
                            "False",
                            "Provisioning Request wasn't provisioned. ETA: 2024-02-22T10:36:40Z",
                        ),
                        ACCEPTED,
                    ),
                )
            ),
            Want("Pending", "Provisioning Request wasn't provisioned. ETA: 2024-02-22T10:36:40Z"),
        ),
    ),
]

STALE_ERROR = (
    f'Error creating ProvisioningRequest "{R1}": provisioningrequests.autoscaling.x-k8s.io '
    f'"{R1}" already exists'
)


def foreign_request() -> Obj:
    """A request of the attempt's name that nobody labelled as gangcheck's."""
    obj = request()
    obj["metadata"]["annotations"] = {}
    return obj


def interrupted_request() -> Obj:
    """The attempt's request, made by an earlier reconcile that was cut short."""
    obj = request()
    obj["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "gangcheck"}
    obj["metadata"]["annotations"] = {
        "gangcheck.io/workload": "wl",
        "gangcheck.io/check": CHECK,
        "gangcheck.io/attempt": "1",
        "gangcheck.io/workload-uid": "uid-wl",
    }
    return obj


def merge_pod_sets_workload(*, topology: bool) -> tuple[PS, ...]:
    """The podSetMergePolicy cases' five pod sets: ps1/ps2 cpu on flv1, ps3-ps5 memory on
    flv2, admitted 1, 2, 2, 1, 1."""
    if not topology:
        return (
            PS("ps1", 2, template(cpu="1"), "flv1", admitted=1),
            PS("ps2", 2, template(cpu="1"), "flv1", admitted=2),
            PS("ps3", 2, template("pc-100", memory="1M"), "flv2", admitted=2),
            PS("ps4", 2, template("pc-100", memory="1M"), "flv2", admitted=1),
            PS("ps5", 1, template("pc-200", memory="1M"), "flv2", admitted=1),
        )
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "type", "operator": "In", "values": ["two"]}]}
                ]
            }
        }
    }
    ps5 = template("pc-300", memory="1M")
    ps5["spec"]["affinity"] = affinity
    return (
        PS("ps1", 2, template("pc-100", cpu="1"), "flv1", admitted=1),
        PS("ps2", 2, template("pc-200", cpu="1"), "flv1", admitted=2),
        PS("ps3", 2, _topology(template("pc-100", memory="1M"), "default1"), "flv2", admitted=2),
        PS("ps4", 2, _topology(template("pc-200", memory="1M"), "default2"), "flv2", admitted=1),
        PS("ps5", 1, ps5, "flv2", admitted=1),
    )


def _topology(tpl: Obj, level: str) -> Obj:
    tpl["metadata"] = {"annotations": {"kueue.x-k8s.io/podset-required-topology": level}}
    return tpl


MERGED_THREE = (
    (naming.template_name(R1, "ps1"), 3),
    (naming.template_name(R1, "ps3"), 3),
    (naming.template_name(R1, "ps5"), 1),
)

IDENTICAL_TEMPLATES = Scene(
    workload(*merge_pod_sets_workload(topology=False)),
    config(retry=None, podSetMergePolicy="IdenticalPodTemplates"),
)
SAME_REQUIREMENTS = Scene(
    workload(*merge_pod_sets_workload(topology=True)),
    config(retry=None, podSetMergePolicy="IdenticalWorkloadSchedulingRequirements"),
)

RECONCILE_CASES += [
    Replay(
        CONTROLLER,
        "TestReconcile/workload sets AdmissionCheck status to Rejected when it is not finished "
        "and receives the provisioning request's CapacityRevoked condition",
        BY_DESIGN,
        "CapacityRevoked on an admitted, active Workload: Rejected",
        one(
            base(
                conditions=("Admitted",),
                requests=(with_conditions(*ADMITTED_PROVISIONED, REVOKED),),
            ),
            Want("Rejected", "capacity revoked", events=("AdmissionCheckUpdated",)),
        ),
        why=f"Kueue's Rejected message is empty when the autoscaler gave none; {MESSAGE_ROW}",
        only_message=True,
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/workload sets AdmissionCheck status to Rejected when it is not admitted "
        "and receives the provisioning request's CapacityRevoked condition",
        BY_DESIGN,
        "CapacityRevoked before admission: Rejected",
        one(
            base(requests=(with_conditions(*ADMITTED_PROVISIONED, REVOKED),)),
            Want("Rejected", "capacity revoked"),
        ),
        why=f"Kueue's Rejected message is empty when the autoscaler gave none; {MESSAGE_ROW}",
        only_message=True,
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/workloads doesnt set AdmissionCheck status to Rejected when it is finished "
        "and receives the provisioning request's CapacityRevoked condition",
        MATCH,
        "CapacityRevoked on a finished Workload: not rejected; the request is deleted",
        one(
            base(
                conditions=("Finished",),
                requests=(with_conditions(*ADMITTED_PROVISIONED, REVOKED),),
            ),
            Want(deletes=(R1,)),
        ),
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/workload does nothing when admitted and receives the provisioning "
        "request's BookingExpired condition",
        DIFFERS,
        "BookingExpired on an admitted Workload whose check is still Pending: gangcheck turns "
        "the check Ready (a Ready check, the reachable state, is left alone)",
        (
            (
                base(
                    conditions=("Admitted",),
                    requests=(with_conditions(*ADMITTED_PROVISIONED, expired()),),
                ),
                Want("Ready", updates=BOTH_CONSUME_R1),
            ),
            (
                base(
                    conditions=("Admitted",),
                    checks=((CHECK, "Ready"), ("not-provisioning", "Pending")),
                    requests=(with_conditions(*ADMITTED_PROVISIONED, expired()),),
                ),
                Want(),
            ),
        ),
        why="Kueue changes nothing: its BookingExpired case matches before Provisioned and "
        "does nothing once the Workload is admitted, whatever the check's state. Kueue's "
        "fixture (admitted with the check Pending) cannot arise from Kueue's own admission",
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/workload retries the admission check when is not admitted and receives "
        "the provisioning request's BookingExpired condition",
        MATCH,
        "BookingExpired before admission, a retry left: Retry with the autoscaler's message",
        one(
            base(
                config=config(parameters={"p1": "v1"}, retry=1),
                requests=(with_conditions(*ADMITTED_PROVISIONED, expired("Expired By test")),),
            ),
            Want("Retry", "Retrying after booking expired: Expired By test", requeue=60),
        ),
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/workload rejects the admission check when is not admitted and receives "
        "the provisioning request's BookingExpired condition",
        BY_DESIGN,
        "BookingExpired before admission, no retry left: Rejected, saying why",
        one(
            base(
                config=config(parameters={"p1": "v1"}, retry=0),
                requests=(with_conditions(*ADMITTED_PROVISIONED, expired()),),
            ),
            Want("Rejected", "provisioning ended by booking expired, with no message"),
        ),
        why="Kueue's Rejected message is empty (copied into its deactivation event); "
        "docs/kueue-differences.md, 'Rejected after the last retry when the autoscaler's "
        "message is empty'",
        only_message=True,
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/when pod template creation error",
        MATCH,
        "templates are created before the request, so a refused template stops the attempt "
        "before any request exists (the reconciler reports it on the check and as FailedCreate)",
        one(
            Scene(
                workload(
                    PS("main", 1),
                    annotations={"provreq.kueue.x-k8s.io/ValidUntilSeconds": "0"},
                ),
                TRUST,
            ),
            Want(
                "Pending",
                creates=(R1,),
                templates=(naming.template_name(R1, "main"),),
            ),
        ),
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/when provisioning request creation error",
        MATCH,
        "both templates, then the request: a refused request leaves the templates, owned by "
        "the Workload (the reconciler reports it on the check and as FailedCreate)",
        one(base(), Want("Pending", creates=(R1,), templates=T1)),
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/when the provisioning request already exists",
        BY_DESIGN,
        "AlreadyExists from an object gangcheck made for this attempt counts as created",
        one(
            base(),
            Want("Pending", creates=(R1,), taken_by=interrupted_request(), taken_is_ours=True),
        ),
        why="Kueue v0.19 retries silently when its cache has not seen the object yet "
        "(isMissingInCache); gangcheck judges by who made the object; "
        "docs/kueue-differences.md, 'A name already taken'",
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/when the existing request is already visible in the cache",
        MATCH,
        "AlreadyExists from someone else's object is a collision, reported on the check",
        one(
            base(), Want("Pending", creates=(R1,), taken_by=foreign_request(), taken_is_ours=False)
        ),
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/when the request has no conditions yet the previous check message is "
        "cleared",
        BY_DESIGN,
        "a stale error message gives way to what the check waits for",
        one(
            base(message=STALE_ERROR, requests=(BASE_REQUEST,)),
            Want("Pending", f"waiting for provisioning request {R1} to be accepted"),
        ),
        why=f"Kueue clears the message to empty; {MESSAGE_ROW}",
        only_message=True,
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/when the request is provisioned the previous check message is cleared",
        BY_DESIGN,
        "a stale error message gives way to Ready's 'capacity provisioned'",
        one(
            base(message=STALE_ERROR, requests=(with_conditions(("Provisioned", "True", "")),)),
            Want("Ready", "capacity provisioned", updates=BOTH_CONSUME_R1),
        ),
        why=f"Kueue clears the message to empty; {MESSAGE_ROW}",
        only_message=True,
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/when request is provisioned and has NodeSelector specified via "
        "ProvisioningClassDetail",
        MATCH,
        "podSetUpdates carry the node selector read from the class details",
        one(
            base(
                config={
                    **BASE_CONFIG,
                    "podSetUpdates": {
                        "nodeSelector": [
                            {
                                "key": "node-selector-key",
                                "valueFromProvisioningClassDetail": "node-selector-value",
                            }
                        ]
                    },
                },
                requests=(
                    with_conditions(
                        PROVISIONED, details={"node-selector-value": "nodes-selector-xyz"}
                    ),
                ),
            ),
            Want(
                "Ready",
                "By test",
                updates=BOTH_CONSUME_R1,
                node_selector={"node-selector-key": "nodes-selector-xyz"},
            ),
        ),
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/when request is provisioned and has NodeSelector missing in the "
        "ProvisioningClassDetail",
        MATCH,
        "a class detail that is missing adds no node selector",
        one(
            base(
                config={
                    **BASE_CONFIG,
                    "podSetUpdates": {
                        "nodeSelector": [
                            {
                                "key": "node-selector-key",
                                "valueFromProvisioningClassDetail": "node-selector-value",
                            }
                        ]
                    },
                },
                requests=(with_conditions(PROVISIONED, details={"some-detail": "xyz"}),),
            ),
            Want("Ready", "By test", updates=BOTH_CONSUME_R1, node_selector={}),
        ),
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/with podSetMergePolicy IdenticalPodTemplates",
        BY_DESIGN,
        "IdenticalPodTemplates merges identical pod sets only: three request pod sets",
        (
            (
                IDENTICAL_TEMPLATES,
                Want(
                    "Pending",
                    creates=(R1,),
                    pod_sets=MERGED_THREE,
                    template_has={
                        MERGED_THREE[1][0]: {"priorityClassName": "pc-100"},
                        MERGED_THREE[2][0]: {"priorityClassName": "pc-200"},
                    },
                    template_owners=(),
                ),
            ),
            handed_over(IDENTICAL_TEMPLATES, request(pod_sets=MERGED_THREE, parameters={})),
        ),
        why=OWNERS,
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/with podSetMergePolicy IdenticalWorkloadSchedulingRequirements",
        BY_DESIGN,
        "IdenticalWorkloadSchedulingRequirements ignores priority and topology, not affinity",
        (
            (
                SAME_REQUIREMENTS,
                Want(
                    "Pending",
                    creates=(R1,),
                    pod_sets=MERGED_THREE,
                    template_owners=(),
                ),
            ),
            handed_over(SAME_REQUIREMENTS, request(pod_sets=MERGED_THREE, parameters={})),
        ),
        why=OWNERS,
    ),
    Replay(
        CONTROLLER,
        "TestReconcile/with podSetMergePolicy but no PodSetAssignments",
        BY_DESIGN,
        "pod sets the admission does not name: the inconsistency is reported, no request made",
        one(
            Scene(
                workload(
                    PS("ps11", 2, assigned=False),
                    PS("ps22", 2, assigned=False),
                    extra_assignments=("ps1", "ps2", "ps3", "ps4", "ps5"),
                ),
                config(retry=None, podSetMergePolicy="IdenticalWorkloadSchedulingRequirements"),
            ),
            Want("Pending", "the admission is inconsistent: no podSetAssignment for pod set ps11"),
        ),
        why="Kueue returns errInconsistentPodSetAssignments from the reconcile; "
        "docs/kueue-differences.md, 'An admission without an assignment'",
    ),
]

R2 = "wl-check1-2"


def attempt_request(name: str, *conditions: tuple[str, str, str]) -> Obj:
    return request(name, pod_sets=((naming.template_name(name, "main"), 4),), conditions=conditions)


ONE_POD_SET = (PS("main", 4),)

ACTIVE_REQUEST_CASES = [
    Replay(
        CONTROLLER,
        "TestActiveOrLastPRForChecks/no provisioning requests",
        MATCH,
        "no request yet: the attempt's request is the one to make",
        one(
            Scene(workload(*ONE_POD_SET), BASE_CONFIG),
            Want("Pending", creates=(R1,)),
        ),
    ),
    Replay(
        CONTROLLER,
        "TestActiveOrLastPRForChecks/two provisioning requests; 1 then 2",
        BY_DESIGN,
        "the request followed is the one the Workload's retryCount names (attempt 1, Failed: "
        "Retry); attempt 2's is deleted as stale",
        one(
            Scene(
                workload(*ONE_POD_SET),
                BASE_CONFIG,
                requests=(attempt_request(R1, failed()), attempt_request(R2)),
            ),
            Want("Retry", "Retrying after failure: By test", deletes=(R2,)),
        ),
        why="Kueue follows the highest attempt number among the requests, whatever the "
        "retryCount; docs/kueue-differences.md, 'Which request is the attempt's'",
    ),
    Replay(
        CONTROLLER,
        "TestActiveOrLastPRForChecks/two provisioning requests; 2 then 1",
        BY_DESIGN,
        "the order the requests are listed in does not matter: retryCount names the attempt",
        one(
            Scene(
                workload(*ONE_POD_SET),
                BASE_CONFIG,
                requests=(attempt_request(R2), attempt_request(R1, failed())),
            ),
            Want("Retry", "Retrying after failure: By test", deletes=(R2,)),
        ),
        why="as the case before",
    ),
]

MESSAGE_CASES = [
    Replay(
        CONTROLLER,
        "TestUpdateCheckMessage/sets a message on a check that has none",
        MATCH,
        "a check without a message gets the request's",
        one(
            base(requests=(with_conditions(("Provisioned", "True", "provisioned")),)),
            Want("Ready", "provisioned"),
        ),
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestUpdateCheckMessage/replaces an existing message",
        MATCH,
        "an earlier message is replaced by the request's",
        one(
            base(
                message="waiting for capacity",
                requests=(with_conditions(("Provisioned", "True", "provisioned")),),
            ),
            Want("Ready", "provisioned"),
        ),
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestUpdateCheckMessage/clears an existing message when the new one is empty",
        BY_DESIGN,
        "gangcheck never writes an empty message: the earlier one gives way to what it waits for",
        one(
            base(
                message='Error creating ProvisioningRequest "wl-check1-1": already exists',
                requests=(BASE_REQUEST,),
            ),
            Want("Pending", f"waiting for provisioning request {R1} to be accepted"),
        ),
        why=f"Kueue clears the message; {MESSAGE_ROW}",
        only_message=True,
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestUpdateCheckMessage/reports no change when the message is unchanged",
        MATCH,
        "the same message again: no write",
        one(
            base(
                message=f"waiting for provisioning request {R1} to be accepted",
                requests=(BASE_REQUEST,),
            ),
            Want(),
        ),
        since="v0.19.2",
    ),
    Replay(
        CONTROLLER,
        "TestUpdateCheckMessage/reports no change when both messages are empty",
        MATCH,
        "a Ready check with no message and nothing new: no write",
        one(
            base(
                checks=((CHECK, "Ready"), ("not-provisioning", "Pending")),
                requests=(with_conditions(("Provisioned", "True", "")),),
            ),
            Want(),
        ),
        since="v0.19.2",
    ),
]


def admission_check(
    controller: str = checkconfig.CONTROLLER_NAME, parameters: Obj | None = None
) -> Obj:
    spec: Obj = {"controllerName": controller}
    if parameters is not None:
        spec["parameters"] = parameters
    return {"metadata": {"name": "check1", "generation": 1}, "spec": spec}


def params(group: str = checkconfig.CONFIG_GROUP, kind: str = checkconfig.CONFIG_KIND) -> Obj:
    return {"apiGroup": group, "kind": kind, "name": "config1"}


ACTIVE_CASES = [
    Replay(
        AC_RECONCILER,
        "TestReconcileAdmissionCheck/unrelated check",
        MATCH,
        "an AdmissionCheck of another controller is not ours: no condition",
        active=Active(admission_check("other-controller")),
    ),
    Replay(
        AC_RECONCILER,
        "TestReconcileAdmissionCheck/no parameters specified",
        BY_DESIGN,
        "a check without parameters is Active with the defaults",
        active=Active(admission_check(), want=("True", "Active", "The admission check is active")),
        why="Kueue requires a ProvisioningRequestConfig (Active=False, BadParametersRef); every "
        "field of gangcheck's config has a default; docs/kueue-differences.md, 'A check "
        "without parameters'",
    ),
    Replay(
        AC_RECONCILER,
        "TestReconcileAdmissionCheck/bad ref group",
        MATCH,
        "parameters of another API group: inactive, BadParametersRef, naming the group",
        active=Active(
            admission_check(parameters=params(group="bad.group")),
            want=("False", "BadParametersRef", "not bad.group/"),
        ),
    ),
    Replay(
        AC_RECONCILER,
        "TestReconcileAdmissionCheck/bad ref kind",
        MATCH,
        "parameters of another kind: inactive, BadParametersRef, naming the kind",
        active=Active(
            admission_check(parameters=params(kind="BadKind")),
            want=("False", "BadParametersRef", "/BadKind"),
        ),
    ),
    Replay(
        AC_RECONCILER,
        "TestReconcileAdmissionCheck/config missing",
        MATCH,
        "a config that does not exist: inactive, BadParametersRef, 'not found'",
        active=Active(
            admission_check(parameters=params()),
            want=("False", "BadParametersRef", "'config1' not found"),
        ),
    ),
    Replay(
        AC_RECONCILER,
        "TestReconcileAdmissionCheck/config found",
        MATCH,
        "a valid config: Active, 'The admission check is active'",
        active=Active(
            admission_check(parameters=params()),
            configs={"config1": {"spec": {}}},
            want=("True", "Active", "The admission check is active"),
        ),
    ),
]

SUITE_PARAMETERS = {"p1": "v1", "p2": "v2", "ValidUntilSeconds": "0"}


def suite_request(
    attempt: int = 1,
    *conditions: tuple[str, str, str],
    class_name: str = "provisioning-class",
    parameters: Mapping[str, str] = SUITE_PARAMETERS,
) -> Obj:
    name = naming.request_name("wl", AC, attempt)
    return request(
        name,
        pod_sets=((naming.template_name(name, "ps1"), 3), (naming.template_name(name, "ps2"), 4)),
        conditions=conditions,
        class_name=class_name,
        parameters=parameters,
        check=AC,
    )


def suite(*requests: Obj, cfg: Mapping[str, Any] | None = SUITE_CONFIG, **kw: Any) -> Scene:
    """The integration suite's Workload and check `ac-prov`, with its requests."""
    return Scene(suite_workload(**kw), cfg, check=AC, requests=requests)


S1, S2, S3 = (naming.request_name("wl", AC, n) for n in (1, 2, 3))
SUITE_CONSUME = {"ps1": S1, "ps2": S1}
BACKOFF: dict[str, Any] = {
    "annotations": {}
}  # the BackoffLimitCount suites' Workload has no provreq annotation


def backoff_suite(limit: int, retry_count: int = 0, *requests: Obj, **kw: Any) -> Scene:
    cfg = config("provisioning-class", retry=limit, base=2)
    return suite(*requests, cfg=cfg, retry_count=retry_count, **BACKOFF, **kw)


def backoff_request(attempt: int, *conditions: tuple[str, str, str]) -> Obj:
    return suite_request(attempt, *conditions, parameters={})


EVICTED_RESET = {"conditions": ("Evicted",)}
"""Kueue core after a Retry: evicted, the check reset to Pending, retryCount counted."""


UPDATED_CONFIG = config(
    "provisioning-class-updated", retry=0, parameters={"p1": "v1updated", "p3": "v3"}
)
UPDATED_REQUEST = suite_request(
    2,
    class_name="provisioning-class-updated",
    parameters={"p1": "v1updated", "p3": "v3", "ValidUntilSeconds": "0"},
)

SUITE_CASES = [
    Replay(
        SUITE,
        "Should not create provisioning requests before quota is reserved",
        MATCH,
        "no quota reserved: no request",
        one(suite(reserved=False), Want()),
    ),
    Replay(
        SUITE,
        "Should not create a provisioning request when all admitted PodSet counts are zero",
        MATCH,
        "every pod set admitted with count zero: Ready, not needed, no request",
        one(
            Scene(
                workload(
                    PS("ps1", 3, template(cpu="1"), "on-demand", admitted=0),
                    PS("ps2", 6, template(cpu="500m"), "on-demand", admitted=0),
                    checks=((AC, "Pending"),),
                ),
                SUITE_CONFIG,
                check=AC,
            ),
            Want("Ready", NOT_NEEDED),
        ),
        since="v0.19.2",
    ),
    Replay(
        SUITE,
        "Should create provisioning requests after quota is reserved and preserve it when "
        "reservation is lost",
        MATCH,
        "quota reserved: the request, with the config's class and parameters and the admitted "
        "counts; quota lost outside eviction: the request is kept",
        (
            (
                suite(),
                Want(
                    "Pending",
                    creates=(S1,),
                    class_name="provisioning-class",
                    parameters=SUITE_PARAMETERS,
                    pod_sets=(
                        (naming.template_name(S1, "ps1"), 3),
                        (naming.template_name(S1, "ps2"), 4),
                    ),
                    template_has={
                        naming.template_name(S1, "ps1"): {
                            "nodeSelector": {"ns1": "ns1v"},
                            "requests": {"cpu": "1"},
                        },
                        naming.template_name(S1, "ps2"): {
                            "nodeSelector": {"ns1": "ns1v"},
                            "requests": {"cpu": "500m", "example.com/gpu": "1"},
                        },
                    },
                ),
            ),
            (suite(suite_request(), reserved=False), Want()),
        ),
    ),
    Replay(
        SUITE,
        "Should delete provisioning requests when workload is evicted",
        MATCH,
        "an evicted Workload's request is deleted",
        (
            (suite(), Want("Pending", creates=(S1,))),
            (suite(suite_request(), conditions=("Evicted",)), Want(deletes=(S1,))),
        ),
        since="v0.19.2",
    ),
    Replay(
        SUITE,
        "Should set the condition ready when the provision succeed",
        MATCH,
        "Accepted: Pending; not yet Provisioned: the ETA; Provisioned: Ready, both pod sets "
        "consuming the request",
        (
            (
                suite(suite_request(1, ACCEPTED)),
                Want("Pending", f"provisioning request {S1} accepted"),
            ),
            (
                suite(
                    suite_request(
                        1,
                        ACCEPTED,
                        ("Provisioned", "False", "Not provisioned, ETA: 2024-02-22T10:36:40Z."),
                    )
                ),
                Want("Pending", "Not provisioned, ETA: 2024-02-22T10:36:40Z."),
            ),
            (
                suite(suite_request(1, ACCEPTED, ("Provisioned", "True", ""))),
                Want("Ready", updates=SUITE_CONSUME, node_selector={}),
            ),
        ),
    ),
    Replay(
        SUITE,
        "Should set the condition rejected when the provision fails",
        MATCH,
        "Failed with no retry left: Rejected (Kueue core then deactivates the Workload)",
        one(suite(suite_request(1, failed(""))), Want("Rejected")),
    ),
    Replay(
        SUITE,
        "Should set AdmissionCheck status to Rejected, deactivate Workload, emit an event, and "
        "bump metrics when workloads is not Finished, and the ProvisioningRequest's condition "
        "is set to CapacityRevoked",
        MATCH,
        "CapacityRevoked on a Ready, admitted Workload: Rejected",
        one(
            suite(
                suite_request(1, ("Provisioned", "True", ""), REVOKED),
                checks=((AC, "Ready"),),
                conditions=("Admitted",),
            ),
            Want("Rejected"),
        ),
    ),
    Replay(
        SUITE,
        "Should set AdmissionCheck status to Rejected, deactivate Workload, emit an event, and "
        "bump metrics when workloads is not Admitted, and the ProvisioningRequest's condition "
        "is set to CapacityRevoked",
        MATCH,
        "CapacityRevoked before admission: Rejected",
        one(suite(suite_request(1, REVOKED)), Want("Rejected")),
    ),
    Replay(
        SUITE,
        "Should not set AdmissionCheck status to Rejected, deactivate Workload, emit an event, "
        "and bump metrics when workload is Finished, and the ProvisioningRequest's condition "
        "is set to CapacityRevoked",
        MATCH,
        "Provisioned: Ready; finished: the request is deleted, the check not rejected",
        (
            (
                suite(suite_request(1, ("Provisioned", "True", ""))),
                Want("Ready", updates=SUITE_CONSUME),
            ),
            (
                suite(
                    suite_request(1, ("Provisioned", "True", ""), REVOKED),
                    checks=((AC, "Ready"),),
                    conditions=("Admitted", "Finished"),
                ),
                Want(deletes=(S1,)),
            ),
        ),
    ),
    Replay(
        SUITE,
        "Should delete the ProvisioningRequest when workload is Finished",
        MATCH,
        "Provisioned: Ready; finished: the request is deleted, the check left Ready",
        (
            (
                suite(suite_request(1, ("Provisioned", "True", ""))),
                Want("Ready", updates=SUITE_CONSUME),
            ),
            (
                suite(
                    suite_request(1, ("Provisioned", "True", "")),
                    checks=((AC, "Ready"),),
                    conditions=("Admitted", "Finished"),
                ),
                Want(deletes=(S1,)),
            ),
        ),
        since="v0.19.2",
    ),
    Replay(
        SUITE,
        "Should ignore the change if Workload is Admitted and the ProvisioningRequest's "
        "condition is set to BookingExpired",
        MATCH,
        "BookingExpired after admission: the check stays Ready",
        one(
            suite(
                suite_request(1, ("Provisioned", "True", ""), expired()),
                checks=((AC, "Ready"),),
                conditions=("Admitted",),
            ),
            Want(),
        ),
    ),
    Replay(
        SUITE,
        "Should keep the provisioning config in sync",
        BY_DESIGN,
        "a class or parameter change before Provisioned ends the attempt (Retry) and the next "
        "one uses the new config, twice; a missing config keeps the request in flight and the "
        "check says it is not active",
        (
            (suite(), Want("Pending", creates=(S1,), class_name="provisioning-class")),
            (
                suite(
                    suite_request(),
                    cfg=UPDATED_CONFIG,
                ),
                Want("Retry", "Retrying after config change: class 'provisioning-class' ->"),
            ),
            (
                suite(retry_count=1, cfg=UPDATED_CONFIG),
                Want("Pending", creates=(S2,), class_name="provisioning-class-updated"),
            ),
            (
                suite(UPDATED_REQUEST, retry_count=1, cfg=SUITE_CONFIG2),
                Want(
                    "Retry", "Retrying after config change: class 'provisioning-class-updated' ->"
                ),
            ),
            (
                suite(UPDATED_REQUEST, retry_count=1, cfg=None),
                Want("Pending", "the check is not active"),
            ),
        ),
        why="Kueue replaces the request under the same name with the new class and parameters, "
        "twice (config edited, then the check pointed at another config), and deletes it when "
        "the config is missing; docs/kueue-differences.md, 'Config class or parameters changed "
        "before Provisioned' and 'Config deleted or made invalid while an attempt is in flight'",
    ),
    Replay(
        SUITE,
        "Should let a running workload to continue after the provisioning request deleted",
        MATCH,
        "Provisioned: Ready; the request deleted by hand once admitted: still Ready, none remade",
        (
            (
                suite(suite_request(1, ("Provisioned", "True", ""))),
                Want("Ready", updates=SUITE_CONSUME),
            ),
            (suite(checks=((AC, "Ready"),), conditions=("Admitted",)), Want()),
        ),
    ),
    Replay(
        SUITE,
        "Admission checks for an evicted workload are Pending",
        MATCH,
        "Failed with a retry left: Retry; once Kueue evicts and resets the check to Pending, "
        "gangcheck writes nothing more (and deletes the request)",
        (
            (backoff_suite(1, 0, backoff_request(1, failed(""))), Want("Retry", requeue=2)),
            (
                backoff_suite(1, 1, backoff_request(1, failed("")), **EVICTED_RESET),
                Want(deletes=(S1,)),
            ),
        ),
    ),
    Replay(
        SUITE,
        "Should retry if a ProvisioningRequest fails, then succeed if the second Provisioning "
        "request succeeds",
        MATCH,
        "attempt 1 Failed: Retry; evicted: its request deleted; readmitted with retryCount 1: "
        "attempt 2 made; Provisioned: Ready on attempt 2",
        (
            (backoff_suite(1, 0, backoff_request(1, failed(""))), Want("Retry", requeue=2)),
            (
                backoff_suite(1, 1, backoff_request(1, failed("")), **EVICTED_RESET),
                Want(deletes=(S1,)),
            ),
            (backoff_suite(1, 1), Want("Pending", creates=(S2,))),
            (
                backoff_suite(1, 1, backoff_request(2, ("Provisioned", "True", ""))),
                Want("Ready", updates={"ps1": S2, "ps2": S2}),
            ),
        ),
    ),
    Replay(
        SUITE,
        "Should retry if a ProvisioningRequest fails, then reject AdmissionCheck if the second "
        "ProvisioningRequest fails",
        MATCH,
        "attempt 1 Failed: Retry; attempt 2 Failed with backoffLimitCount 1: Rejected",
        (
            (backoff_suite(1, 0, backoff_request(1, failed(""))), Want("Retry", requeue=2)),
            (backoff_suite(1, 1), Want("Pending", creates=(S2,))),
            (backoff_suite(1, 1, backoff_request(2, failed(""))), Want("Rejected")),
        ),
    ),
    Replay(
        SUITE,
        "Should retry when a ProvisioningRequest is in BookingExpired stated, then succeed if "
        "the second Provisioning request succeeds",
        MATCH,
        "attempt 1's booking expired before admission: Retry; attempt 2 Provisioned: Ready",
        (
            (
                backoff_suite(1, 0, backoff_request(1, ("Provisioned", "True", ""), expired())),
                Want("Retry", "Retrying after booking expired", requeue=2),
            ),
            (backoff_suite(1, 1), Want("Pending", creates=(S2,))),
            (
                backoff_suite(1, 1, backoff_request(2, ("Provisioned", "True", ""))),
                Want("Ready", updates={"ps1": S2, "ps2": S2}),
            ),
        ),
    ),
    Replay(
        SUITE,
        "Should retry twice if a ProvisioningRequest fails twice",
        MATCH,
        "backoffLimitCount 2: two failures retry (backoff 2 s, then 4 s); attempt 3 is made",
        (
            (backoff_suite(2, 0, backoff_request(1, failed(""))), Want("Retry", requeue=2)),
            (backoff_suite(2, 1, backoff_request(2, failed(""))), Want("Retry", requeue=4)),
            (
                backoff_suite(2, 2, backoff_request(2, failed("")), **EVICTED_RESET),
                Want(deletes=(S2,)),
            ),
            (backoff_suite(2, 2), Want("Pending", creates=(S3,))),
        ),
    ),
]


def merge_suite() -> Scene:
    """The merge-policy suite: master 1 and worker 4 (2 admitted), the same requests,
    different labels."""

    def labelled(role: str) -> Obj:
        tpl = template(cpu="1", memory="2Gi")
        tpl["metadata"] = {"labels": {"role": role}}
        return tpl

    wl = workload(
        PS("master", 1, labelled("master"), "on-demand"),
        PS("worker", 4, labelled("worker"), "on-demand", admitted=2),
        checks=((AC, "Pending"),),
    )
    cfg = config(
        "provisioning-class", retry=0, podSetMergePolicy="IdenticalWorkloadSchedulingRequirements"
    )
    return Scene(wl, cfg, check=AC)


AC1, AC2 = "ac-prov1", "ac-prov2"
P1, P2 = naming.request_name("wl", AC1, 1), naming.request_name("wl", AC2, 1)
SCHEDULING_CONFIG = config("provisioning-class", retry=None)


def job_workload(
    flavor: str, checks: tuple[tuple[str, str], ...], *conditions: str, memory: str = ""
) -> Obj:
    """The scheduling suite's Job: one pod of 500m cpu (and `memory`), on `flavor`."""
    requests = {"cpu": "500m", **({"memory": memory} if memory else {})}
    return workload(
        PS("main", 1, template(**requests), flavor), checks=checks, conditions=conditions
    )


def job_request(name: str, check: str, *conditions: tuple[str, str, str]) -> Obj:
    return request(
        name,
        pod_sets=((naming.template_name(name, "main"), 1),),
        conditions=conditions,
        class_name="provisioning-class",
        parameters={},
        check=check,
    )


def preempted_steps(memory: str = "") -> tuple[tuple[Scene, Want], ...]:
    """wl1 on flavor-1 with ac-prov1: request made, Provisioned, Ready; preempted (evicted):
    its request deleted; readmitted on flavor-2, where no check applies: nothing left."""
    on1 = ((AC1, "Pending"),)
    provisioned = job_request(P1, AC1, ("Provisioned", "True", ""))
    selector = {naming.template_name(P1, "main"): {"nodeSelector": {"ns1": "ns1v"}}}
    return (
        (
            Scene(job_workload("flavor-1", on1, memory=memory), SCHEDULING_CONFIG, check=AC1),
            Want("Pending", creates=(P1,), template_has=selector),
        ),
        (
            Scene(
                job_workload("flavor-1", on1, memory=memory),
                SCHEDULING_CONFIG,
                check=AC1,
                requests=(provisioned,),
            ),
            Want("Ready", updates={"main": P1}),
        ),
        (
            Scene(
                job_workload("flavor-1", ((AC1, "Ready"),), "Admitted", "Evicted", memory=memory),
                SCHEDULING_CONFIG,
                check=AC1,
                requests=(provisioned,),
            ),
            Want(deletes=(P1,)),
        ),
        (
            Scene(
                job_workload("flavor-2", (), "Admitted", memory=memory),
                SCHEDULING_CONFIG,
                check=AC1,
            ),
            Want(),
        ),
    )


SUITE_CASES += [
    Replay(
        SUITE,
        "Should merge similar PodSets into one PodTemplate, PodSetMergePolicy is "
        "IdenticalWorkloadSchedulingRequirements",
        MATCH,
        "pod sets differing only in labels merge: one request pod set of the admitted 3",
        one(
            merge_suite(),
            Want("Pending", creates=(S1,), pod_sets=((naming.template_name(S1, "master"), 3),)),
        ),
    ),
    Replay(
        SUITE,
        "Should be successfully re-admitted on another flavor without an admission check",
        MATCH,
        "the check's request is made, Provisioned and Ready; preempted, its request is deleted; "
        "readmitted where the check does not apply, nothing is made",
        preempted_steps(),
    ),
    Replay(
        SUITE,
        "Should be successfully re-admitted on another flavor with another admission check",
        MATCH,
        "preempted off ac-prov1's flavor: its request is deleted; readmitted under ac-prov2: "
        "ac-prov2's request for flavor-2 is made, Provisioned, Ready",
        (
            *preempted_steps()[:3],
            (
                Scene(job_workload("flavor-2", ((AC2, "Pending"),)), SCHEDULING_CONFIG, check=AC2),
                Want(
                    "Pending",
                    creates=(P2,),
                    template_has={
                        naming.template_name(P2, "main"): {"nodeSelector": {"ns2": "ns2v"}}
                    },
                ),
            ),
            (
                Scene(
                    job_workload("flavor-2", ((AC2, "Pending"),)),
                    SCHEDULING_CONFIG,
                    check=AC2,
                    requests=(job_request(P2, AC2, ("Provisioned", "True", "")),),
                ),
                Want("Ready", updates={"main": P2}),
            ),
            (
                Scene(
                    job_workload("flavor-2", ((AC2, "Ready"),), "Admitted"),
                    SCHEDULING_CONFIG,
                    check=AC1,
                    requests=(job_request(P1, AC1, ("Provisioned", "True", "")),),
                ),
                Want(deletes=(P1,)),
            ),
        ),
    ),
    Replay(
        SUITE,
        "Should be successfully re-admitted on another flavor with a decimal memory request",
        MATCH,
        "a decimal memory request (220M) is carried into the template as written; preemption "
        "and readmission go as without a check",
        preempted_steps(memory="220M"),
    ),
]

REPLAYS = (
    ACTIVE_CASES
    + MERGE_CASES
    + NEEDED_CASES
    + RECONCILE_CASES
    + ACTIVE_REQUEST_CASES
    + MESSAGE_CASES
    + SUITE_CASES
)


# ---- the tests -----------------------------------------------------------------------------


@pytest.mark.parametrize("replay", [r for r in REPLAYS if r.active is None], ids=lambda r: r.id)
def test_decision_replay(replay: Replay) -> None:
    assert replay.steps
    for i, (scene, want) in enumerate(replay.steps):
        try:
            check_step(decide_in(scene), want)
        except AssertionError as e:
            raise AssertionError(f"step {i + 1} of {len(replay.steps)}: {e}") from e


@pytest.mark.parametrize("replay", [r for r in REPLAYS if r.active is not None], ids=lambda r: r.id)
def test_active_condition_replay(replay: Replay) -> None:
    case = replay.active
    assert case is not None
    if case.want is None:
        assert not checkconfig.is_ours(case.admission_check)
        return
    assert checkconfig.is_ours(case.admission_check)
    resolution = checkconfig.resolve(case.admission_check, case.configs.get)
    condition = checkconfig.active_condition(resolution, 1, T0, None)
    status, reason, words = case.want
    assert (condition["status"], condition["reason"]) == (status, reason)
    assert words in condition["message"]
    assert condition["observedGeneration"] == 1


def test_every_replay_is_classified_and_explained() -> None:
    assert len({r.id for r in REPLAYS}) == len(REPLAYS)
    assert len({(r.source, r.case) for r in REPLAYS}) == len(REPLAYS)
    for r in REPLAYS:
        assert r.verdict in (MATCH, BY_DESIGN, DIFFERS), r.id
        assert bool(r.why) == (r.verdict != MATCH), r.id
        assert not r.only_message or r.verdict == BY_DESIGN, r.id


def counts() -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = {}
    for r in REPLAYS:
        out.setdefault(r.source, Counter())[r.verdict] += 1
    return out


def test_the_documented_replay_counts_are_the_table_s() -> None:
    """docs/kueue-differences.md gives the count per file and class; it must be this table's."""
    doc = (Path(__file__).parents[2] / "docs" / "kueue-differences.md").read_text()
    for source, by_class in counts().items():
        row = re.search(
            rf"^\| `{re.escape(source)}` \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|", doc, re.M
        )
        assert row is not None, source
        total = sum(by_class.values())
        assert tuple(int(g) for g in row.groups()) == (
            total,
            by_class[MATCH],
            by_class[BY_DESIGN],
            by_class[DIFFERS],
        ), source
