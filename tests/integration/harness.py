"""The test plays Kueue core and the autoscaler against a real API server, as Kueue's own
integration suite does, while gangcheck's controller runs in the same event loop."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml
from gangcheck_dev.testbed.identity import HARNESS, Identity, ensure_identity
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.app import Controller
from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError, ConflictError, ForbiddenError, NotFoundError
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    ATOMIC_CONFIG,
    EVENT,
    NAMESPACE,
    NODE,
    POD,
    POD_TEMPLATE,
    PROVISIONING_REQUEST,
    RESOURCE_FLAVOR,
    SERVICE_ACCOUNT,
    WORKLOAD,
    Resource,
)
from gangcheck.logic.attempt import naming
from gangcheck.logic.timefmt import format_time
from gangcheck.model.names import FENCE_LABEL
from tests import waiting
from tests.builders import CONTROLLER, WorkloadBuilder, container, node
from tests.waiting import cancelled

TEST_LABEL = "gangcheck-test"
#: The controller's progressDelaySeconds in these tests (3 s shipped): a progress message
#: still waits behind a held write, but a test that reads one waits less (docs/testing.md).
PROGRESS_DELAY = 0.5
FENCE_POLICY = Path(__file__).resolve().parents[2] / "manifests" / "base" / "fence-policy.yaml"
FENCE_REFUSAL = "is being reclaimed by gangcheck"
FIELD_MANAGER = "gangcheck-tests"
#: The test CRDs (tests/crds/: Karpenter's NodeClaim, Cluster API's machines).
TEST_CRDS = sorted((Path(__file__).resolve().parents[1] / "crds").glob("*.yaml"))
#: gangcheck's record on a node of which request it arrived for (``<namespace>/<request>``).
ARRIVED = "gangcheck.io/arrived-for"
#: A check's config that trusts the autoscaler's Provisioned (no fit of its own).
TRUST: dict[str, Any] = {"fulfillment": {"mode": "TrustProvisioned"}}

Obj = dict[str, Any]
T = TypeVar("T")
_ids = itertools.count(1)


def kubectl(cp: ControlPlane, *args: str, stdin: str | None = None) -> str:
    done = cp.run_kubectl(*args, stdin=stdin, check=False)
    assert done.returncode == 0, f"kubectl {' '.join(args)} failed: {done.stderr}"
    return done.stdout


def token_kubeconfig(cp: ControlPlane, user: str, token: str, path: Path) -> Path:
    """A kubeconfig of ``cp`` (its CA embedded) whose user ``user`` authenticates with
    ``token``, written to ``path`` (mode 0600)."""
    ca = base64.b64encode(cp.pki.ca_cert.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "testbed", "cluster": {"server": cp.server, "certificate-authority-data": ca}}
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "testbed", "user": user}}],
        "current-context": user,
    }
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config))
    return path


ROLE = Resource("rbac.authorization.k8s.io", "v1", "roles", "Role")
ROLE_BINDING = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")


@contextlib.asynccontextmanager
async def namespace_user(
    cp: ControlPlane,
    admin: Kube,
    namespace: str,
    name: str,
    *,
    rules: list[Obj],
    probe: Resource,
    kubeconfig: Path,
) -> AsyncIterator[Kube]:
    """A client acting as ServiceAccount `name` of `namespace`, bound there by a Role of
    `rules` (a token of its own, written to `kubeconfig`): once the API server's RBAC cache
    has the Role (a list of `probe` in the namespace no longer answered 403)."""
    await admin.create(SERVICE_ACCOUNT, {"metadata": {"name": name}}, namespace)
    await admin.create(ROLE, {"metadata": {"name": name}, "rules": rules}, namespace)
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    binding = {"metadata": {"name": name}, "roleRef": ref, "subjects": [subject]}
    await admin.create(ROLE_BINDING, binding, namespace)
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    path = f"{SERVICE_ACCOUNT.object_path(name, namespace)}/token"
    token = (await admin.request("POST", path, body=review))["status"]["token"]
    async with await Kube.connect(str(token_kubeconfig(cp, name, token, kubeconfig))) as user:

        async def granted() -> bool:
            try:
                await user.list_objects(probe, namespace)
            except ApiError as e:
                if e.status == 403:
                    return False
                raise
            return True

        await eventually(granted, what=f"the Role of {name} granted")
        yield user


def apply(
    cp: ControlPlane, manifests: str, *extra: str, manager: str = FIELD_MANAGER
) -> tuple[str, str]:
    """Server-side apply, as a person would; returns kubectl's (stdout, stderr), stderr
    holding any warning."""
    args = ("apply", "--server-side", f"--field-manager={manager}", "-f", "-", *extra)
    done = cp.run_kubectl(*args, stdin=manifests, check=False)
    assert done.returncode == 0, f"kubectl apply failed: {done.stderr}"
    return done.stdout, done.stderr


def deny_policy(
    name: str,
    rule: Obj,
    validation: Obj,
    *,
    match_conditions: list[Obj] | None = None,
    namespace: str | None = None,
) -> str:
    """A ValidatingAdmissionPolicy `name` denying what `rule` (one resourceRules entry)
    matches and `validation` (expression, message, reason) refuses, and its binding (to the
    namespace `namespace` only, if given), as manifests for `apply`."""
    spec: Obj = {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [rule]},
        "validations": [validation],
    }
    if match_conditions:
        spec["matchConditions"] = match_conditions
    binding: Obj = {"policyName": name, "validationActions": ["Deny"]}
    if namespace is not None:
        selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        binding["matchResources"] = {"namespaceSelector": selector}
    api = "admissionregistration.k8s.io/v1"
    policy = {"apiVersion": api, "kind": "ValidatingAdmissionPolicy", "spec": spec}
    bound = {"apiVersion": api, "kind": "ValidatingAdmissionPolicyBinding", "spec": binding}
    return yaml.safe_dump_all([{**o, "metadata": {"name": name}} for o in (policy, bound)])


@contextlib.contextmanager
def fence_policy_installed(cp: ControlPlane) -> Iterator[None]:
    """manifests/base/fence-policy.yaml applied (`apply`), and removed afterwards."""
    text = FENCE_POLICY.read_text()
    apply(cp, text)
    try:
        yield
    finally:
        cp.run_kubectl("delete", "--ignore-not-found", "-f", "-", stdin=text, check=False)


def pod_on(ns: str, name: str, node: str, **annotations: str) -> Obj:
    """A pod created with spec.nodeName set (no scheduler), tolerating every taint."""
    meta = {"name": name, "namespace": ns, "annotations": annotations}
    spec = {"nodeName": node, "tolerations": [{"operator": "Exists"}], "containers": [container()]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


async def until_fence_enforced(kube: Kube, namespace: str, node: str | None = None) -> None:
    """The API server loads policies and their parameters (the fenced nodes) from informers:
    wait until a dry-run pod onto `node` (which carries the fence label), or else onto a
    probe node made with it and deleted again, is refused."""
    probe = node or f"fence-probe-{uuid.uuid4().hex[:8]}"
    if node is None:
        await kube.create(NODE, {"metadata": {"name": probe, "labels": {FENCE_LABEL: "true"}}})

    async def refused() -> bool:
        body = pod_on(namespace, f"fence-probe-{uuid.uuid4().hex[:8]}", probe)
        try:
            await kube.request("POST", POD.collection_path(namespace), query={"dryRun": "All"},
                               body=body)  # fmt: skip
        except ForbiddenError as e:
            return FENCE_REFUSAL in str(e)
        return False

    try:
        await eventually(refused, timeout=30, what=f"binds to {probe} to be refused")
    finally:
        if node is None:
            with contextlib.suppress(NotFoundError):
                await kube.delete(NODE, probe)


def now() -> str:
    from datetime import UTC, datetime

    return format_time(datetime.now(UTC))


async def eventually(
    probe: Callable[[], Awaitable[T | None]], *, timeout: float = 20.0, what: str = "condition"
) -> T:
    """Poll probe until it returns something truthy; fail naming what did not happen
    (tests/waiting.eventually, every 0.1 s: a local API server answers at once)."""
    return await waiting.eventually(probe, timeout=timeout, what=what, interval=0.1)


async def never(probe: Callable[[], Awaitable[object]], *, seconds: float, what: str) -> None:
    """Assert probe stays falsy for a while (used sparingly, for 'nothing more happens')."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen = await probe()
        assert not seen, f"{what}: {seen!r}"
        await asyncio.sleep(0.1)


def as_identity(kubeconfig: str, identity: Identity = HARNESS) -> str:
    """A kubeconfig that runs gangcheck as ``identity`` with only what the shipped manifests
    give it (the base's RBAC, every component's, the base's admission policies), installed on
    the cluster of the admin ``kubeconfig`` the first time (testbed/identity.py). A kubeconfig
    without credentials is a fault proxy's, which forwards as that identity itself."""
    path = Path(kubeconfig)
    user = (yaml.safe_load(path.read_text()).get("users") or [{}])[0].get("user") or {}
    return str(ensure_identity(path, identity)) if user else kubeconfig


class RunningController:
    """gangcheck's controller as a task with its own API connection; kill and restart at will.

    It runs as gangcheck's ServiceAccount under the shipped RBAC and admission policies
    (:func:`as_identity`), so a test it passes in proves none of them refuses gangcheck's own
    writes; ``identity=None`` runs it with the kubeconfig's own credentials. The fence policy
    is not installed for it: it refuses binds of every writer, and the tests of reclaim
    install it (or leave it out) themselves."""

    def __init__(self, kubeconfig: str, *, identity: Identity | None = HARNESS) -> None:
        self.kubeconfig = kubeconfig
        self.identity = identity
        self._task: asyncio.Task[None] | None = None
        self._kube: Kube | None = None
        self.controller: Controller | None = None
        self.refused: list[str] = []
        """Every write the API server refused as forbidden (RBAC) or by an admission policy;
        :meth:`stop` fails the test if there is one. (Reads are left out: a kube-apiserver
        just restarted answers them 403 until its RBAC informers have synced.)"""
        self._forgiven: list[str] = []

    async def start(self) -> Controller:
        kubeconfig = self.kubeconfig
        if self.identity is not None:
            kubeconfig = await asyncio.to_thread(as_identity, kubeconfig, self.identity)
        self._kube = await Kube.connect(kubeconfig)
        original = self._kube.request

        async def request(method: str, path: str, **kw: Any) -> Any:
            try:
                return await original(method, path, **kw)
            except ApiError as e:
                if method != "GET" and (e.status == 403 or "ValidatingAdmissionPolicy" in str(e)):
                    self.refused.append(f"{method} {path}: {e}")
                raise

        self._kube.request = request  # type: ignore[method-assign]
        self.controller = Controller(
            self._kube, workers=2, watch_timeout=30, progress_delay_seconds=PROGRESS_DELAY
        )
        self._task = asyncio.create_task(self.controller.run())
        # Every cache lists the whole (shared, test-filled) control plane first.
        await asyncio.wait_for(self.controller.caches.wait_synced(), 60)
        return self.controller

    def forgive_rbac_refusals(self) -> list[str]:
        """Drop the refusals by RBAC seen so far (a kube-apiserver just restarted answers 403
        until its RBAC informers have synced), keeping those of an admission policy; returns
        the ones dropped."""
        dropped = [r for r in self.refused if _by_rbac(r)]
        self.refused[:] = [r for r in self.refused if not _by_rbac(r)]
        return dropped

    def forgive_refusals(self, marker: str) -> list[str]:
        """Drop the refusals whose text holds `marker` (a test's own policy), those seen so
        far and those still to come (the controller retries the refused write on backoff
        until it stops); returns the ones seen so far."""
        self._forgiven.append(marker)
        seen = [r for r in self.refused if marker in r]
        self.refused[:] = [r for r in self.refused if marker not in r]
        return seen

    async def stop(self) -> None:
        if self._task is not None:
            await cancelled(self._task)
            self._task = None
        if self._kube is not None:
            await self._kube.close()
            self._kube = None
        self.refused[:] = [r for r in self.refused if not any(m in r for m in self._forgiven)]
        assert not self.refused, "the API server refused gangcheck's own calls:\n" + "\n".join(
            self.refused
        )


class CrashingController(RunningController):
    """A controller whose process 'dies' right after its n-th write to the API server, or
    with `after_path`, right after its first write to that path (whatever it wrote before:
    the order of writes to different objects, or to other tests' objects on the shared API
    server, is not the test's to assume)."""

    def __init__(
        self, kubeconfig: str, *, after_writes: int = 1, after_path: str | None = None
    ) -> None:
        super().__init__(kubeconfig)
        self.after_writes = after_writes
        self.after_path = after_path
        self.written: list[str] = []
        """Each write so far, as `METHOD path` (Events left out); the n-th one (or the first
        to `after_path`) kills it."""
        self._dead = asyncio.Event()

    async def crashed(self) -> bool:
        return self._dead.is_set()

    async def start(self) -> Any:
        controller = await super().start()
        kube = controller.kube
        original = kube.request

        async def request(method: str, path: str, **kw: Any) -> Any:
            if self._dead.is_set():
                await asyncio.Event().wait()  # a dead process does nothing more
            result = await original(method, path, **kw)
            if method != "GET" and "/events" not in path:
                self.written.append(f"{method} {path}")
                if (
                    path == self.after_path
                    if self.after_path is not None
                    else len(self.written) >= self.after_writes
                ):
                    self._dead.set()
            return result

        kube.request = request  # type: ignore[method-assign]
        return controller


async def arrived_for(cluster: Cluster, request: str) -> list[str]:
    """The nodes recorded as arrived for ``request`` of the cluster's namespace, by name."""
    key = f"{cluster.ns}/{request}"
    return sorted(
        n["metadata"]["name"]
        for n in await cluster.nodes()
        if (n["metadata"].get("annotations") or {}).get(ARRIVED) == key
    )


def req_name(cluster: Cluster, workload: str = "wl", attempt: int = 1) -> str:
    """The name of `workload`'s request of `attempt` under the cluster's check."""
    return naming.request_name(workload, cluster.check, attempt)


async def _until_written(write: Callable[[], Awaitable[Obj]], what: str) -> Obj:
    """A read-modify-write of the tests' (as Kueue, the autoscaler or the node lifecycle
    controller, each of which retries its own) done again while it meets a write of
    gangcheck's made meanwhile (409)."""
    for _ in range(20):
        try:
            return await write()
        except ConflictError:
            continue
    raise AssertionError(f"could not write {what}: changed at each of 20 tries")


class Cluster:
    """What a test does to the cluster: as a user, as Kueue core, as the autoscaler."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.ns = namespace
        suffix = next(_ids)
        self.check = f"atomic{suffix}"
        self.config = f"gpu{suffix}"

    # ---- set up, as a platform engineer ------------------------------------------------

    @classmethod
    async def create(cls, kube: Kube) -> Cluster:
        ns = f"t{next(_ids)}-{int(time.time() * 1000) % 100000}"
        await kube.create(NAMESPACE, {"metadata": {"name": ns}})
        # No controller-manager runs here: pods need the namespace's ServiceAccount made by hand.
        await kube.create(SERVICE_ACCOUNT, {"metadata": {"name": "default", "namespace": ns}})
        return cls(kube, ns)

    @property
    def flavor(self) -> str:
        return f"flavor-{self.ns}"

    @property
    def pool(self) -> dict[str, str]:
        """The node label of this test's flavor: nodes of other tests never match."""
        return {"pool": self.ns}

    async def install_check(
        self, spec: Obj | None, *, flavor_labels: dict[str, str] | None = None
    ) -> None:
        if spec is not None:
            await self.kube.create(ATOMIC_CONFIG, {"metadata": {"name": self.config}, "spec": spec})
        await self.kube.create(
            ADMISSION_CHECK,
            {
                "metadata": {"name": self.check},
                "spec": {
                    "controllerName": CONTROLLER,
                    "parameters": {
                        "apiGroup": "gangcheck.io",
                        "kind": "AtomicProvisioningConfig",
                        "name": self.config,
                    },
                },
            },
        )
        await self.kube.create(
            RESOURCE_FLAVOR,
            {"metadata": {"name": self.flavor}, "spec": {"nodeLabels": flavor_labels or self.pool}},
        )

    async def set_config(self, spec: Obj) -> None:
        cfg = await self.kube.get(ATOMIC_CONFIG, self.config)
        cfg["spec"] = spec
        await self.kube.replace(ATOMIC_CONFIG, cfg)

    async def active_condition(self) -> Obj | None:
        ac = await self.kube.get(ADMISSION_CHECK, self.check)
        conds = (ac.get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "Active"), None)

    # ---- as Kueue core --------------------------------------------------------------------

    async def submit(self, builder: WorkloadBuilder, *, reserve: bool = True) -> str:
        """Create the Workload, then (as Kueue would) reserve quota and list our check Pending."""
        obj = builder.build()
        meta = obj["metadata"]
        meta["namespace"] = self.ns
        for key in ("uid", "resourceVersion"):
            meta.pop(key, None)
        status = obj.pop("status")
        for entry in status.get("admissionChecks") or []:
            if entry["name"] == "atomic":
                entry["name"] = self.check
        self.use_my_flavor(status)
        created = await self.kube.create(WORKLOAD, obj)
        if reserve:
            created["status"] = status
            await self.kube.replace(WORKLOAD, created, subresource="status")
        return str(meta["name"])

    def use_my_flavor(self, status: Obj) -> None:
        for assignment in (status.get("admission") or {}).get("podSetAssignments") or []:
            assignment["flavors"] = {r: self.flavor for r in assignment["flavors"]}

    async def workload(self, name: str) -> Obj:
        return await self.kube.get(WORKLOAD, name, self.ns)

    async def check_state(self, name: str) -> Obj:
        wl = await self.workload(name)
        entries = (wl.get("status") or {}).get("admissionChecks") or []
        return next(e for e in entries if e["name"] == self.check)

    async def wait_check(self, name: str, state: str, *, timeout: float = 20) -> Obj:
        async def probe() -> Obj | None:
            entry = await self.check_state(name)
            return entry if entry["state"] == state else None

        return await eventually(probe, timeout=timeout, what=f"check {state} on {name}")

    async def update_status(self, name: str, mutate: Callable[[Obj], None]) -> Obj:
        """Read-modify-write the Workload status (retrying on conflicts), as Kueue core does."""

        def with_status(wl: Obj) -> None:
            wl.setdefault("status", {})
            mutate(wl)

        return await self._rewrite(name, with_status, subresource="status")

    async def update_spec(self, name: str, mutate: Callable[[Obj], None]) -> Obj:
        """Read-modify-write the Workload itself (retrying on conflicts), as Kueue's
        EnsureWorkloadSlices does when it changes a slice's counts in place."""
        return await self._rewrite(name, mutate, subresource=None)

    async def _rewrite(
        self, name: str, mutate: Callable[[Obj], None], *, subresource: str | None
    ) -> Obj:
        async def once() -> Obj:
            wl = await self.workload(name)
            mutate(wl)
            return await self.kube.replace(WORKLOAD, wl, subresource=subresource)

        return await _until_written(once, f"workload {name} ({subresource or 'spec'})")

    async def evict_and_requeue(self, name: str) -> None:
        """Kueue core after Retry: evict, release quota, reset checks to Pending (retryCount+1),
        each with the message Kueue v0.17 writes (resetChecksOnEviction): 'Reset to Pending
        after eviction. Previously: <state>'."""

        def evict(wl: Obj) -> None:
            st = wl["status"]
            _set_condition(st, "Evicted", "True", "AdmissionCheck")
            _set_condition(st, "QuotaReserved", "False", "Pending")
            st.pop("admission", None)
            for entry in st.get("admissionChecks") or []:
                if entry["state"] == "Retry":
                    entry["retryCount"] = int(entry.get("retryCount") or 0) + 1
                if entry["state"] != "Pending":
                    entry.update(
                        state="Pending",
                        message=f"Reset to Pending after eviction. Previously: {entry['state']}",
                        lastTransitionTime=now(),
                    )
                    entry.pop("podSetUpdates", None)

        await self.update_status(name, evict)

    async def reserve_again(self, name: str, builder: WorkloadBuilder) -> None:
        status = builder.build()["status"]
        self.use_my_flavor(status)
        admission = status["admission"]

        def reserve(wl: Obj) -> None:
            st = wl["status"]
            _set_condition(st, "Evicted", "False", "Requeued")
            _set_condition(st, "QuotaReserved", "True", "QuotaReserved")
            st["admission"] = admission

        await self.update_status(name, reserve)

    async def set_workload_condition(self, name: str, kind: str, status: str = "True") -> None:
        await self.update_status(name, lambda wl: _set_condition(wl["status"], kind, status, kind))

    async def delete_workload(self, name: str) -> None:
        await self.kube.delete(WORKLOAD, name, self.ns)

    # ---- as the autoscaler ------------------------------------------------------------

    async def request(self, name: str) -> Obj | None:
        try:
            return await self.kube.get(PROVISIONING_REQUEST, name, self.ns)
        except NotFoundError:
            return None

    async def wait_request(self, name: str, *, timeout: float = 20) -> Obj:
        return await eventually(lambda: self.request(name), timeout=timeout, what=f"request {name}")

    async def wait_request_gone(self, name: str, *, timeout: float = 20) -> None:
        async def gone() -> bool:
            return await self.request(name) is None

        await eventually(gone, timeout=timeout, what=f"request {name} deleted")

    async def set_request_conditions(self, name: str, conditions: dict[str, str]) -> None:
        """Each condition True with its message, the others kept."""

        def add(status: Obj) -> None:
            by_type = {c["type"]: c for c in status.get("conditions") or []}
            for kind, message in conditions.items():
                by_type[kind] = {
                    "type": kind,
                    "status": "True",
                    "reason": kind,
                    "message": message,
                    "lastTransitionTime": now(),
                }
            status["conditions"] = list(by_type.values())

        await self.update_request_status(name, add)

    async def update_request_status(self, name: str, mutate: Callable[[Obj], None]) -> None:
        """As the autoscaler does: the request's status read, changed and written, read again
        when gangcheck annotated the request meanwhile."""

        async def once() -> Obj:
            req = await self.wait_request(name)
            req["status"] = dict(req.get("status") or {})
            mutate(req["status"])
            return await self.kube.replace(PROVISIONING_REQUEST, req, subresource="status")

        await _until_written(once, f"the status of request {name}")

    async def requests(self) -> list[Obj]:
        listing = await self.kube.list_objects(PROVISIONING_REQUEST, self.ns)
        return list(listing.get("items") or [])

    async def templates(self) -> list[Obj]:
        listing = await self.kube.list_objects(POD_TEMPLATE, self.ns)
        return list(listing.get("items") or [])

    async def events(self, reason: str | None = None) -> list[Obj]:
        items = (await self.kube.list_objects(EVENT, self.ns)).get("items") or []
        return [e for e in items if reason is None or e.get("reason") == reason]

    async def wait_events(
        self, reason: str, *, about: str | None = None, timeout: float = 20.0
    ) -> list[Obj]:
        """The Events of this reason (about the named object, if given), once there is one:
        gangcheck records an Event after the write it reports, so it may trail that write."""

        async def found() -> list[Obj]:
            events = await self.events(reason)
            return [e for e in events if about is None or e["involvedObject"]["name"] == about]

        return await eventually(found, timeout=timeout, what=f"a {reason} Event")

    async def add_nodes(
        self,
        count: int,
        *,
        gpu: int = 1,
        prefix: str = "n",
        taints: list[Obj] | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> list[str]:
        """As the cloud: Nodes that register and turn Ready, in a later second than anything
        made before the call (creationTimestamp has 1 s resolution, and gangcheck counts a
        node as arrived for a request only when it is stamped in a later second; a real
        node takes longer than that to come up)."""
        await asyncio.sleep(1.001 - time.time() % 1)
        names = []
        for _ in range(count):
            name = f"{self.ns}-{prefix}{next(_ids)}"
            body = node(
                name,
                gpu=gpu,
                labels={**self.pool, **(labels or {}), TEST_LABEL: self.ns},
                taints=taints,
            )
            status = body.pop("status")
            body["metadata"].pop("creationTimestamp")
            body["metadata"].pop("resourceVersion")
            if annotations:
                body["metadata"]["annotations"] = {
                    **(body["metadata"].get("annotations") or {}),
                    **annotations,
                }
            await self.kube.create(NODE, body)
            await self.kube.merge_patch(NODE, name, {"status": status}, subresource="status")
            await self._drop_not_ready_taint(name)
            names.append(name)
        return names

    async def _drop_not_ready_taint(self, name: str) -> None:
        """As the node lifecycle controller does once a node is Ready: drop the not-ready taint
        the API server put on it at registration, and only that one (gangcheck may have
        written its own meanwhile), at the resourceVersion read."""

        async def once() -> Obj:
            node = await self.kube.get(NODE, name)
            taints = node["spec"].get("taints") or []
            kept = [t for t in taints if t["key"] != "node.kubernetes.io/not-ready"]
            if kept == taints:
                return node
            meta = {"resourceVersion": node["metadata"]["resourceVersion"]}
            patch = {"metadata": meta, "spec": {"taints": kept or None}}
            return await self.kube.merge_patch(NODE, name, patch)

        await _until_written(once, f"node {name} without its not-ready taint")

    async def nodes(self) -> list[Obj]:
        listing = await self.kube.list_objects(NODE, label_selector=f"{TEST_LABEL}={self.ns}")
        return list(listing.get("items") or [])

    async def remove_nodes(self) -> None:
        for n in await self.nodes():
            with contextlib.suppress(NotFoundError):
                await self.kube.delete(NODE, n["metadata"]["name"])

    async def create_pod(
        self, name: str, *, node_name: str = "", consume: str = "", gpu: int = 1
    ) -> Obj:
        """A pod bound to a node (no scheduler here: nodeName is set at creation) or pending."""
        spec: Obj = {"containers": [container(gpu=gpu)], "restartPolicy": "Never"}
        if node_name:
            spec["nodeName"] = node_name
        meta: Obj = {"name": name, "namespace": self.ns}
        if consume:
            meta["annotations"] = {"autoscaling.x-k8s.io/consume-provisioning-request": consume}
        return await self.kube.create(POD, {"metadata": meta, "spec": spec})


def _set_condition(status: Obj, kind: str, value: str, reason: str) -> None:
    conds = status.setdefault("conditions", [])
    conds[:] = [c for c in conds if c["type"] != kind]
    conds.append(
        {
            "type": kind,
            "status": value,
            "reason": reason,
            "message": reason,
            "lastTransitionTime": now(),
        }
    )


def _by_rbac(refusal: str) -> bool:
    """A refusal by RBAC, not by an admission policy."""
    return "403" in refusal and "ValidatingAdmissionPolicy" not in refusal
