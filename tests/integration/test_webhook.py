"""The pod-gating webhook (gangcheck/webhook.py) over TLS, alone and called by a real
kube-apiserver.

First the server on its own: AdmissionReviews in and out, malformed reviews, and certificate
files that appear late or rotate. Then the test bed's kube-apiserver calls it through a
MutatingWebhookConfiguration registered by URL (https://127.0.0.1:<port>) with the test's own
CA: members of PodGroups created in an opted-in namespace come out gated and annotated, other
pods untouched; with the server stopped, members are created ungated (failurePolicy Ignore).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import socket
import ssl
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from gangcheck_dev.testbed.certs import CertificateAuthority, KeyPair

from gangcheck.app import RunOptions, WebhookOptions, _serve
from gangcheck.kube.client import Kube
from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import MUTATING_WEBHOOK, NAMESPACE, POD
from gangcheck.logic.podgroups.gating import (
    COSCHEDULING,
    COSCHEDULING_LABEL,
    OPT_IN_VALUE,
    UPSTREAM,
    gated_at,
    is_gated,
)
from gangcheck.model.names import GATE, GATED_AT, OPT_IN_LABEL
from gangcheck.telemetry import Metrics
from gangcheck.webhook import MUTATE_PATH, WebhookServer
from tests.integration.harness import Cluster, eventually
from tests.waiting import cancelled

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
_ids = itertools.count(1)


# ---- certificates and the server ------------------------------------------------------


@dataclass
class Certs:
    ca: CertificateAuthority
    cert_file: Path
    key_file: Path

    def issue(self) -> KeyPair:
        """A fresh serving certificate for 127.0.0.1, written where the server reads it."""
        pair = self.ca.issue_serving("gangcheck-webhook", ["127.0.0.1"])
        pair.write(self.cert_file, self.key_file)
        return pair

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca.cert_pem.decode())


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return Certs(
        CertificateAuthority.create("gangcheck-webhook-test-ca"),
        tmp_path / "tls.crt",
        tmp_path / "tls.key",
    )


@dataclass
class Running:
    server: WebhookServer
    gated: list[str]
    errors: list[str]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"


@pytest.fixture
async def webhook(certs: Certs) -> AsyncIterator[Running]:
    certs.issue()
    gated: list[str] = []
    errors: list[str] = []
    server = WebhookServer(
        cert_file=certs.cert_file,
        key_file=certs.key_file,
        bind_address="127.0.0.1",
        port=0,
        on_gated=gated.append,
        on_error=errors.append,
    )
    await server.start()
    try:
        yield Running(server, gated, errors)
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def session(certs: Certs) -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(ssl=certs.client_context(), force_close=True)
    async with aiohttp.ClientSession(connector=connector) as s:
        yield s


def review(obj: Any, *, uid: str = "u-1", operation: str = "CREATE", **request: Any) -> Obj:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": operation,
            "namespace": "ns",
            "name": "p",
            "object": obj,
            **request,
        },
    }


def member(**spec: Any) -> Obj:
    return {
        "metadata": {"name": "p", "namespace": "ns", "labels": {COSCHEDULING_LABEL: "g"}},
        "spec": {"containers": [{"name": "c", "image": "x"}], **spec},
    }


def decoded_patch(answer: Obj) -> list[Obj] | None:
    response = answer["response"]
    if "patch" not in response:
        assert "patchType" not in response
        return None
    assert response["patchType"] == "JSONPatch"
    patch: list[Obj] = json.loads(base64.b64decode(response["patch"]))
    return patch


# ---- the server alone -----------------------------------------------------------------


async def test_a_member_is_answered_with_the_gate_patch_and_its_uid(
    webhook: Running, certs: Certs
) -> None:
    async with session(certs) as s:
        async with s.post(f"{webhook.url}{MUTATE_PATH}", json=review(member(), uid="abc")) as r:
            assert r.status == 200
            answer = await r.json()
        async with s.get(f"{webhook.url}/healthz") as r:
            assert r.status == 200
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "abc"
    assert answer["response"]["allowed"] is True
    patch = decoded_patch(answer)
    assert patch is not None
    assert patch[0] == {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}
    assert patch[1]["path"] == "/metadata/annotations"
    assert webhook.gated == [COSCHEDULING]
    assert webhook.errors == []


NOT_PATCHED = [
    pytest.param(review({"metadata": {}, "spec": {}}), id="not a member"),
    pytest.param(review(member(schedulingGates=[{"name": GATE}])), id="already gated"),
    pytest.param(review(member(), operation="UPDATE"), id="an update"),
    pytest.param(review(member(), subResource="status"), id="a subresource"),
    pytest.param(
        review(member(), resource={"group": "", "version": "v1", "resource": "podtemplates"}),
        id="another resource",
    ),
    pytest.param(review(None, operation="DELETE"), id="no object"),
]


HOLD = "status-taint.cluster-autoscaler.kubernetes.io/gangcheck-held-for"
WARNED = [
    pytest.param(
        {"metadata": {}, "spec": {"schedulingGates": [{"name": GATE}]}},
        "gangcheck: the pod carries the gangcheck.io/provisioning scheduling gate but names no "
        "PodGroup: gangcheck never lifts it, the pod waits until it is removed",
        id="the gate without a group",
    ),
    pytest.param(
        member(nodeName="n1"),
        "gangcheck: the pod names PodGroup g but is bound to node n1 at creation: it is not "
        "gated, starts before its gang's capacity exists, and ignores gangcheck's holds",
        id="a member bound at creation",
    ),
    pytest.param(
        {"metadata": {}, "spec": {"tolerations": [{"key": HOLD, "operator": "Exists"}]}},
        f"gangcheck: the pod tolerates {HOLD} with operator Exists: it may be scheduled onto "
        "nodes gangcheck keeps for gangs, taking a gang's capacity",
        id="tolerating every gang's hold",
    ),
]


@pytest.mark.parametrize(("obj", "warning"), WARNED)
async def test_a_pod_gangcheck_cannot_hold_as_it_asks_is_allowed_unpatched_with_a_warning(
    webhook: Running, certs: Certs, obj: Obj, warning: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        session(certs) as s,
        s.post(f"{webhook.url}{MUTATE_PATH}", json=review(obj)) as r,
    ):
        assert r.status == 200
        answer = await r.json()
    assert answer["response"] == {"uid": "u-1", "allowed": True, "warnings": [warning]}
    assert f"pod ns/p: {warning}" in caplog.text
    assert webhook.gated == []
    assert webhook.errors == []


async def test_warnings_that_fail_never_cost_a_member_its_gate(
    webhook: Running, certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_: Any) -> tuple[str, ...]:
        raise RuntimeError("warnings broken")

    monkeypatch.setattr("gangcheck.webhook.admission_warnings", broken)
    async with (
        session(certs) as s,
        s.post(f"{webhook.url}{MUTATE_PATH}", json=review(member())) as r,
    ):
        assert r.status == 200
        answer = await r.json()
    assert decoded_patch(answer) is not None
    assert "warnings" not in answer["response"]
    assert webhook.gated == [COSCHEDULING]


@pytest.mark.parametrize("body", NOT_PATCHED)
async def test_anything_else_is_allowed_unpatched(
    webhook: Running, certs: Certs, body: Obj
) -> None:
    async with (
        session(certs) as s,
        s.post(f"{webhook.url}{MUTATE_PATH}", json=body) as r,
    ):
        assert r.status == 200
        answer = await r.json()
    assert answer["response"] == {"uid": "u-1", "allowed": True}
    assert webhook.gated == []
    assert webhook.errors == []


_DEEP = b'"x": ' + b'{"x": ' * 100_000 + b"0" + b"}" * 100_000 + b", "
"""A member deeper than Python's JSON parser goes (its recursion limit)."""
MALFORMED = [
    pytest.param(b"{not json", "not JSON", id="not JSON"),
    pytest.param(b"[]", "not a JSON object", id="a list"),
    pytest.param(
        json.dumps({**review(member()), "apiVersion": "admission.k8s.io/v1beta1"}).encode(),
        "expected apiVersion",
        id="v1beta1",
    ),
    pytest.param(
        json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
        "no request",
        id="no request",
    ),
    pytest.param(json.dumps(review(member(), uid="")).encode(), "no uid", id="no uid"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, "nested too deeply", id="nested arrays"),
    pytest.param(
        json.dumps(review(member())).encode().replace(b'"object": {', b'"object": {' + _DEEP),
        "nested too deeply",
        id="a pod nested too deeply",
    ),
]


@pytest.mark.parametrize(("body", "message"), MALFORMED)
async def test_a_malformed_review_is_a_bad_request(
    webhook: Running, certs: Certs, body: bytes, message: str
) -> None:
    async with (
        session(certs) as s,
        s.post(f"{webhook.url}{MUTATE_PATH}", data=body) as r,
    ):
        assert r.status == 400
        assert message in await r.text()
    assert webhook.errors == ["malformed"]


async def test_a_failing_metrics_hook_does_not_fail_the_admission(
    certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    certs.issue()

    def broken(_: str) -> None:
        raise RuntimeError("metrics down")

    server = WebhookServer(
        cert_file=certs.cert_file,
        key_file=certs.key_file,
        bind_address="127.0.0.1",
        port=0,
        on_gated=broken,
    )
    await server.start()
    try:
        async with (
            session(certs) as s,
            s.post(f"https://127.0.0.1:{server.port}{MUTATE_PATH}", json=review(member())) as r,
        ):
            assert r.status == 200
            assert decoded_patch(await r.json()) is not None
    finally:
        await server.stop()
    assert "metrics hook failed" in caplog.text


async def served_certificate(certs: Certs, port: int) -> bytes:
    """The DER certificate the server presents in a fresh handshake."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=certs.client_context())
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True)
        assert der is not None
        return bytes(der)
    finally:
        writer.close()
        await writer.wait_closed()


def der(pair: KeyPair) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    return x509.load_pem_x509_certificate(pair.cert_pem).public_bytes(Encoding.DER)


async def test_rotated_certificate_files_are_served_from_the_next_handshake(
    certs: Certs,
) -> None:
    first = certs.issue()
    server = WebhookServer(
        cert_file=certs.cert_file,
        key_file=certs.key_file,
        bind_address="127.0.0.1",
        port=0,
        reload_interval=0,
    )
    await server.start()
    try:
        assert await served_certificate(certs, server.port) == der(first)
        second = certs.issue()
        assert await served_certificate(certs, server.port) == der(second)
        # Half a rotation (a key that does not match the certificate) keeps the last good pair.
        certs.key_file.write_bytes(certs.ca.issue_serving("x", ["127.0.0.1"]).key_pem)
        assert await served_certificate(certs, server.port) == der(second)
        assert server.certificates.loads == 2
    finally:
        await server.stop()


async def test_certificate_files_that_appear_after_start_are_served(certs: Certs) -> None:
    server = WebhookServer(
        cert_file=certs.cert_file,
        key_file=certs.key_file,
        bind_address="127.0.0.1",
        port=0,
        reload_interval=0,
    )
    await server.start()
    try:
        assert not server.certificate_loaded
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await served_certificate(certs, server.port)
        pair = certs.issue()
        assert await served_certificate(certs, server.port) == der(pair)
        assert server.certificate_loaded
    finally:
        await server.stop()


async def test_stop_is_idempotent_and_the_port_is_known_only_while_serving(
    certs: Certs,
) -> None:
    certs.issue()
    server = WebhookServer(
        cert_file=certs.cert_file, key_file=certs.key_file, bind_address="127.0.0.1", port=0
    )
    with pytest.raises(RuntimeError):
        _ = server.port
    await server.start()
    assert server.port > 0
    await server.stop()
    await server.stop()
    with pytest.raises(RuntimeError):
        _ = server.port


# ---- called by kube-apiserver ---------------------------------------------------------


def webhook_configuration(name: str, url: str, ca_pem: bytes) -> Obj:
    """As manifests/base/webhook.yaml, but reaching the server by URL with the test's CA."""
    return {
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "pods.gangcheck.io",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {
                    "url": f"{url}{MUTATE_PATH}",
                    "caBundle": base64.b64encode(ca_pem).decode(),
                },
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {"matchLabels": {OPT_IN_LABEL: OPT_IN_VALUE}},
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "timeoutSeconds": 5,
                "reinvocationPolicy": "IfNeeded",
            }
        ],
    }


def pod_body(
    name: str, namespace: str, *, group: str | None = None, label: str | None = None
) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace}
    if label is not None:
        meta["labels"] = {COSCHEDULING_LABEL: label}
    spec: Obj = {
        "containers": [{"name": "c", "image": "registry.invalid/never-runs:1"}],
        "restartPolicy": "Never",
    }
    if group is not None:
        spec["schedulingGroup"] = {"podGroupName": group}
    return {"metadata": meta, "spec": spec}


class Pods:
    """Pods the test creates, deleted at the end (nothing schedules or runs them)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.made: list[tuple[str, str]] = []

    async def create(self, name: str, namespace: str, **kw: Any) -> Obj:
        created = await self.kube.create(POD, pod_body(name, namespace, **kw))
        self.made.append((name, namespace))
        return created

    async def delete(self, name: str, namespace: str) -> None:
        with contextlib.suppress(NotFoundError):
            await self.kube.delete(POD, name, namespace, grace_period_seconds=0)

    async def delete_all(self) -> None:
        for name, namespace in self.made:
            await self.delete(name, namespace)


@contextlib.asynccontextmanager
async def registered(kube: Kube, url: str, ca_pem: bytes) -> AsyncIterator[str]:
    """A MutatingWebhookConfiguration of this test's own, deleted at the end whatever happens:
    it is cluster-wide."""
    name = f"gangcheck-test-{uuid.uuid4().hex[:8]}"
    await kube.create(MUTATING_WEBHOOK, webhook_configuration(name, url, ca_pem))
    try:
        yield name
    finally:
        with contextlib.suppress(NotFoundError):
            await kube.delete(MUTATING_WEBHOOK, name)


async def until_the_webhook_gates(pods: Pods, namespace: str, *, timeout: float = 20) -> None:
    """The API server picks new webhook configurations up a moment later: probe with a member
    pod until one comes out gated."""

    async def probe() -> bool:
        name = f"probe-{next(_ids)}"
        created = await pods.create(name, namespace, label="probe")
        await pods.delete(name, namespace)
        return is_gated(created)

    await eventually(probe, timeout=timeout, what="the webhook to gate a probe pod")


def assert_gated(pod: Obj, since: datetime) -> None:
    gates = [g["name"] for g in pod["spec"].get("schedulingGates") or []]
    assert gates == [GATE], pod["spec"]
    when = gated_at(pod)
    assert when is not None, pod["metadata"].get("annotations")
    # RFC 3339, whole seconds, UTC: allow the second it was truncated to.
    assert since - timedelta(seconds=1) <= when <= datetime.now(UTC)
    assert pod["metadata"]["annotations"][GATED_AT].endswith("Z")


def assert_untouched(pod: Obj) -> None:
    assert not pod["spec"].get("schedulingGates"), pod["spec"]
    assert GATED_AT not in (pod["metadata"].get("annotations") or {})


async def test_the_api_server_gates_members_in_opted_in_namespaces_only(
    kube: Kube, cluster: Cluster, webhook: Running, certs: Certs
) -> None:
    opted_in = cluster.ns
    await kube.merge_patch(NAMESPACE, opted_in, {"metadata": {"labels": {OPT_IN_LABEL: "enabled"}}})
    elsewhere = (await Cluster.create(kube)).ns
    pods = Pods(kube)
    try:
        async with registered(kube, webhook.url, certs.ca.cert_pem):
            await until_the_webhook_gates(pods, opted_in)
            since = datetime.now(UTC)
            gated_before = len(webhook.gated)
            upstream = await pods.create("upstream", opted_in, group="gang-a")
            coscheduled = await pods.create("coscheduled", opted_in, label="gang-b")
            plain = await pods.create("plain", opted_in)
            outside = await pods.create("outside", elsewhere, label="gang-c")
        # The test bed's apiserver runs GenericWorkload: the field is kept, not dropped.
        assert upstream["spec"]["schedulingGroup"] == {"podGroupName": "gang-a"}
        assert_gated(upstream, since)
        assert_gated(coscheduled, since)
        assert coscheduled["metadata"]["labels"] == {COSCHEDULING_LABEL: "gang-b"}
        assert_untouched(plain)
        assert_untouched(outside)
        # What was stored is what the create returned.
        assert is_gated(await kube.get(POD, "upstream", opted_in))
        assert not is_gated(await kube.get(POD, "outside", elsewhere))
        assert webhook.gated[gated_before:] == [UPSTREAM, COSCHEDULING]
        assert webhook.errors == []
    finally:
        await pods.delete_all()


async def test_with_the_webhook_down_members_are_created_ungated(
    kube: Kube, cluster: Cluster, webhook: Running, certs: Certs
) -> None:
    await kube.merge_patch(
        NAMESPACE, cluster.ns, {"metadata": {"labels": {OPT_IN_LABEL: "enabled"}}}
    )
    pods = Pods(kube)
    try:
        async with registered(kube, webhook.url, certs.ca.cert_pem):
            await until_the_webhook_gates(pods, cluster.ns)
            await webhook.server.stop()
            began = time.monotonic()
            created = await pods.create("while-down", cluster.ns, group="gang-d")
            # Refused connections fail at once; no waiting for timeoutSeconds either.
            assert time.monotonic() - began < 5
        assert created["spec"]["schedulingGroup"] == {"podGroupName": "gang-d"}
        assert_untouched(created)
        assert_untouched(await kube.get(POD, "while-down", cluster.ns))
    finally:
        await pods.delete_all()


async def test_the_api_server_passes_the_webhooks_warning_to_the_client(
    kube: Kube, cluster: Cluster, webhook: Running, certs: Certs, control_plane: Any
) -> None:
    """A pod made with gangcheck's gate and no PodGroup in an opted-in namespace: created as
    asked (still gated: nothing lifts it), and kubectl prints the webhook's warning."""
    await kube.merge_patch(
        NAMESPACE, cluster.ns, {"metadata": {"labels": {OPT_IN_LABEL: "enabled"}}}
    )
    pods = Pods(kube)
    body = pod_body("self-gated", cluster.ns)
    body.update(apiVersion="v1", kind="Pod")
    body["spec"]["schedulingGates"] = [{"name": GATE}]
    try:
        async with registered(kube, webhook.url, certs.ca.cert_pem):
            await until_the_webhook_gates(pods, cluster.ns)
            pods.made.append(("self-gated", cluster.ns))
            # kubectl in a thread: the webhook answers from this event loop
            done = await asyncio.to_thread(
                partial(control_plane.run_kubectl, check=False),
                "create",
                "-f",
                "-",
                stdin=json.dumps(body),
            )
        assert done.returncode == 0, done.stderr
        assert (
            "Warning: gangcheck: the pod carries the gangcheck.io/provisioning scheduling gate "
            "but names no PodGroup: gangcheck never lifts it, the pod waits until it is removed"
        ) in done.stderr
        stored = await kube.get(POD, "self-gated", cluster.ns)
        assert [g["name"] for g in stored["spec"]["schedulingGates"]] == [GATE]
        assert GATED_AT not in (stored["metadata"].get("annotations") or {})
    finally:
        await pods.delete_all()


# ---- shutdown: NotReady, the webhook answering while it drains --------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(90)
async def test_on_shutdown_the_replica_turns_not_ready_and_the_webhook_answers_while_it_drains(
    kube: Kube, cluster: Cluster, certs: Certs, tmp_path: Path
) -> None:
    """As `gangcheck run` serves it (app._serve) with a controller whose caches never sync:
    ready all the same (the webhook answers); cancelled, as SIGTERM does, /readyz answers
    503 at once while the API server's members are still gated for `drainSeconds`; then the
    webhook stops and members come through ungated (failurePolicy Ignore)."""
    await kube.merge_patch(
        NAMESPACE, cluster.ns, {"metadata": {"labels": {OPT_IN_LABEL: "enabled"}}}
    )
    certs.issue()
    drain = 3.0
    health = _free_port()
    options = RunOptions(
        bind_address="127.0.0.1",
        health_port=health,
        metrics_port=0,
        webhook=WebhookOptions(port=0, cert_dir=str(tmp_path), drain_seconds=drain),
    )
    server = WebhookServer(
        cert_file=certs.cert_file, key_file=certs.key_file, bind_address="127.0.0.1", port=0
    )

    async def forever() -> None:
        await asyncio.Event().wait()

    serving = asyncio.create_task(
        _serve(options, Metrics(), None, forever, serving=lambda: False, webhook=server)
    )
    pods = Pods(kube)
    readyz = f"http://127.0.0.1:{health}/readyz"
    try:
        await eventually(lambda: _true(server.serving), what="the webhook listening")
        async with (
            aiohttp.ClientSession() as http,
            registered(kube, f"https://127.0.0.1:{server.port}", certs.ca.cert_pem),
        ):
            await until_the_webhook_gates(pods, cluster.ns)
            async with http.get(readyz) as answer:
                assert (answer.status, await answer.text()) == (200, "ok")

            serving.cancel()  # what SIGTERM does (cli._until_terminated)
            stopping = time.monotonic()
            await asyncio.sleep(0.2)
            async with http.get(readyz) as answer:
                assert (answer.status, await answer.text()) == (503, "shutting down")
            since = datetime.now(UTC)
            draining = await pods.create("while-draining", cluster.ns, group="gang-e")
            assert not serving.done()

            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(serving, drain + 10)
            assert time.monotonic() - stopping >= drain - 0.1
            assert not server.serving
            after = await pods.create("after-stop", cluster.ns, group="gang-e")
        assert_gated(draining, since)
        assert_gated(await kube.get(POD, "while-draining", cluster.ns), since)
        assert_untouched(after)
    finally:
        await cancelled(serving)
        await pods.delete_all()


async def _true(value: bool) -> bool:
    return value
