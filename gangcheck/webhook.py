"""The mutating admission webhook that gates PodGroup member pods at creation (aiohttp, TLS).

kube-apiserver sends an ``admission.k8s.io/v1`` AdmissionReview for every pod created in an
opted-in namespace (the MutatingWebhookConfiguration in manifests/base/webhook.yaml); the
answer adds the scheduling gate ``gangcheck.io/provisioning`` to members of a PodGroup, and
warns of a pod gangcheck cannot hold as it asks (logic/podgroups/gating.py decides both).
Gating is best effort: the answer always allows the pod, and the configuration's
``failurePolicy: Ignore`` lets pods through when this server is down.

The serving certificate is read from files (a Secret volume, which cert-manager or a person
fills) and read again when they change on disk: at most every ``reload_interval`` seconds, a
TLS handshake stats both files and, when either changed, loads them into a fresh context that
serves the connections from then on. A certificate that does not load (a rotation caught
half-written) leaves the previous one in service. Files missing at start are not an error:
handshakes fail until they appear (pod creation goes on, ungated).

    server = WebhookServer(on_gated=count)    # certs from DEFAULT_CERT_DIR, port 9443
    await server.start()
    ...
    await server.stop()
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import ssl
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from gangcheck.logic.podgroups.gating import admission_warnings, gate_patch, group_of
from gangcheck.logic.timefmt import format_time

log = logging.getLogger(__name__)

#: Where the Deployment mounts the Secret ``gangcheck-webhook-cert`` (keys tls.crt, tls.key).
DEFAULT_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
DEFAULT_PORT = 9443
MUTATE_PATH = "/mutate-pods"
HEALTH_PATH = "/healthz"
REVIEW_API_VERSION = "admission.k8s.io/v1"
REVIEW_KIND = "AdmissionReview"
#: The largest review accepted: a pod may be up to ~1.5 MiB (etcd's request limit).
MAX_REVIEW_BYTES = 4 * 1024 * 1024
_PODS = {"group": "", "version": "v1", "resource": "pods"}


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _call(hook: Callable[[str], None] | None, value: str) -> None:
    """A metrics hook never breaks an admission."""
    if hook is None:
        return
    try:
        hook(value)
    except Exception:
        log.exception("webhook metrics hook failed")


class CertificateFiles:
    """A serving certificate and key on disk, loaded into an SSLContext again when they change.

    ``context`` is the SSLContext to serve with (None until the files load); ``refresh()``
    stats the files (at most every ``interval`` seconds unless forced) and swaps in a fresh
    context when they changed and load. It never raises.
    """

    def __init__(
        self,
        cert_file: Path,
        key_file: Path,
        *,
        interval: float,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.interval = interval
        self.context: ssl.SSLContext | None = None
        #: How many times a certificate was loaded (1 after the first load).
        self.loads = 0
        self._seen: tuple[tuple[int, int, int], ...] | None = None
        self._checked_at = -math.inf
        self._clock = clock
        #: The loaded certificate's notBefore and notAfter (None: not read).
        self._validity: tuple[datetime, datetime] | None = None
        self._said = ""

    def _signature(self) -> tuple[tuple[int, int, int], ...] | None:
        try:
            stats = [os.stat(path) for path in (self.cert_file, self.key_file)]
        except OSError:
            return None
        return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in stats)

    def refresh(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked_at < self.interval:
            return
        self._checked_at = now
        self._say_validity()
        signature = self._signature()
        if signature is None:
            if self._seen is not None or self.context is None:
                consequence = (
                    "keeping the certificate loaded before"
                    if self.context is not None
                    else "TLS handshakes fail until they appear"
                )
                log.warning(
                    "webhook certificate %s or key %s not found: %s",
                    self.cert_file,
                    self.key_file,
                    consequence,
                )
            self._seen = None
            return
        if signature == self._seen:
            return
        # Remember the files even when they do not load: they are tried again once they
        # change (the other half of a rotation lands), not on every handshake.
        self._seen = signature
        try:
            context = server_context(self.cert_file, self.key_file)
        except Exception as e:
            log.warning(
                "webhook certificate %s did not load, keeping the previous: %s", self.cert_file, e
            )
            return
        self.context = context
        self.loads += 1
        log.info("webhook certificate loaded from %s", self.cert_file)
        try:
            self._validity = certificate_validity(self.cert_file.read_bytes())
        except OSError:
            self._validity = None
        self._said = ""
        self._say_validity()

    def _say_validity(self) -> None:
        """Warn, once each time it turns so, that the certificate served is out of its
        validity: kube-apiserver refuses the handshake and, by the failure policy, creates
        every pod ungated. It is served all the same (the previous one is no better)."""
        problem = validity_problem(self._validity, self._clock()) if self.context else ""
        if problem and problem != self._said:
            log.warning("webhook certificate %s %s", self.cert_file, problem)
        self._said = problem


def validity_problem(validity: tuple[datetime, datetime] | None, now: datetime) -> str:
    """What is wrong with serving a certificate of this validity now ("" when nothing)."""
    if validity is None:
        return ""
    not_before, not_after = validity
    if now >= not_after:
        return (
            f"expired at {format_time(not_after)}: kube-apiserver refuses it, so pods are "
            "created ungated until it is renewed"
        )
    if now < not_before:
        return (
            f"is not valid before {format_time(not_before)}: kube-apiserver refuses it, so "
            "pods are created ungated until then"
        )
    return ""


def certificate_validity(pem: bytes) -> tuple[datetime, datetime] | None:
    """The notBefore and notAfter of the first certificate of a PEM file (RFC 5280:
    Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber,
    signature, issuer, validity SEQUENCE { notBefore, notAfter }, ... } ... }); None when it
    cannot be read. Read here, not with a library: the runtime has no X.509 parser."""
    begin, end = b"-----BEGIN CERTIFICATE-----", b"-----END CERTIFICATE-----"
    start = pem.find(begin)
    stop = pem.find(end, start + 1)
    if start < 0 or stop < 0:
        return None
    try:
        der = base64.b64decode(b"".join(pem[start + len(begin) : stop].split()), validate=True)
        certificate = _children(der, *_element(der, 0, 0x30))
        tbs = _children(der, *certificate[0][1:])
        fields = tbs[1:] if tbs[0][0] == 0xA0 else tbs
        not_before, not_after = _children(der, *fields[3][1:])[:2]
        return _asn1_time(der, *not_before), _asn1_time(der, *not_after)
    except (ValueError, IndexError):
        return None


def _element(der: bytes, at: int, tag: int | None = None) -> tuple[int, int]:
    """The content (start, end) of the DER element at `at`, of this tag if given."""
    if tag is not None and der[at] != tag:
        raise ValueError(f"expected tag {tag:#x} at {at}")
    length, at = der[at + 1], at + 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or count > 4:
            raise ValueError("unsupported DER length")
        length, at = int.from_bytes(der[at : at + count], "big"), at + count
    if at + length > len(der):
        raise ValueError("DER element past the end")
    return at, at + length


def _children(der: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    """The elements inside a constructed one: (tag, content start, content end)."""
    out = []
    while start < end:
        content, stop = _element(der, start)
        out.append((der[start], content, stop))
        start = stop
    return out


def _asn1_time(der: bytes, tag: int, start: int, end: int) -> datetime:
    text = der[start:end].decode("ascii")
    if tag == 0x17:  # UTCTime YYMMDDHHMMSSZ: years 1950-2049
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    elif tag != 0x18:  # GeneralizedTime YYYYMMDDHHMMSSZ
        raise ValueError(f"not a time (tag {tag:#x})")
    return datetime.strptime(text, "%Y%m%d%H%M%SZ").replace(tzinfo=UTC)


def server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A TLS server context (1.2 at least) serving this certificate chain and key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


class WebhookServer:
    """``POST /mutate-pods`` (AdmissionReview v1) and ``GET /healthz`` over HTTPS.

    ``port`` 0 picks a free port; the ``port`` property then tells which one after
    ``start()``. ``on_gated(api_group)`` is called once per pod gated, with the PodGroup's API
    group (``scheduling.k8s.io`` or ``scheduling.x-k8s.io``); ``on_error(reason)`` once per
    review answered without gating because of a failure: ``malformed`` (answered 400) or
    ``internal`` (the pod allowed unpatched).
    """

    def __init__(
        self,
        *,
        cert_file: str | Path = DEFAULT_CERT_DIR / "tls.crt",
        key_file: str | Path = DEFAULT_CERT_DIR / "tls.key",
        bind_address: str = "0.0.0.0",
        port: int = DEFAULT_PORT,
        on_gated: Callable[[str], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        reload_interval: float = 10.0,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.certificates = CertificateFiles(
            Path(cert_file), Path(key_file), interval=reload_interval, clock=clock
        )
        self._bind = bind_address
        self._requested_port = port
        self._on_gated = on_gated
        self._on_error = on_error
        self._clock = clock
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        """The port listened on (the one picked when 0 was asked for)."""
        if self._port is None:
            raise RuntimeError("the webhook server is not started")
        return self._port

    @property
    def serving(self) -> bool:
        """Listening: started and not stopped. (Not whether a certificate is loaded: without
        one no replica can answer, and a replica NotReady for it would stall a rollout for
        nothing; it is said in the log.)"""
        return self._runner is not None

    @property
    def certificate_loaded(self) -> bool:
        return self.certificates.context is not None

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("the webhook server is already started")
        self.certificates.refresh(force=True)
        app = web.Application(client_max_size=MAX_REVIEW_BYTES)
        app.router.add_post(MUTATE_PATH, self._mutate)
        app.router.add_get(HEALTH_PATH, self._healthz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._bind, self._requested_port, ssl_context=self._tls())
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        log.info("webhook serving on %s:%d", self._bind, self._port)

    async def stop(self) -> None:
        """Stop listening and close open connections. Idempotent."""
        if self._runner is not None:
            await self._runner.cleanup()
        self._runner = None
        self._port = None

    # ---- TLS ---------------------------------------------------------------------------

    def _tls(self) -> ssl.SSLContext:
        """The listening context: it holds no certificate itself; each handshake is handed
        to the context of the current certificate files."""
        listening = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        listening.minimum_version = ssl.TLSVersion.TLSv1_2
        listening.sni_callback = self._select_certificate
        return listening

    def _select_certificate(
        self, connection: ssl.SSLObject | ssl.SSLSocket, _server_name: str | None, _: Any
    ) -> int | None:
        # Called for every ClientHello, with or without SNI (the apiserver sends none for an
        # IP address).
        self.certificates.refresh()
        context = self.certificates.context
        if context is None:
            return ssl.ALERT_DESCRIPTION_INTERNAL_ERROR
        connection.context = context
        return None

    # ---- HTTP --------------------------------------------------------------------------

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _mutate(self, request: web.Request) -> web.Response:
        try:
            review = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError):
            return self._malformed("the body is not JSON")
        except RecursionError:  # arrays or objects nested deeper than the parser goes
            return self._malformed("the body is nested too deeply")
        problem = _problem(review)
        if problem:
            return self._malformed(problem)
        admission = review["request"]
        answer: dict[str, Any] = {"uid": admission["uid"], "allowed": True}
        try:
            patch = self._patch(admission)
        except Exception:
            log.exception("gating failed; the pod is allowed ungated")
            _call(self._on_error, "internal")
            patch = None
        try:
            warnings = self._warnings(admission)
        except Exception:  # a warning is never worth the gate: the patch stands
            log.exception("the webhook's warnings failed; the pod is answered without them")
            warnings = ()
        if patch:
            answer["patchType"] = "JSONPatch"
            answer["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        if warnings:
            answer["warnings"] = list(warnings)
        return web.json_response(
            {"apiVersion": REVIEW_API_VERSION, "kind": REVIEW_KIND, "response": answer}
        )

    def _malformed(self, problem: str) -> web.Response:
        log.warning("malformed admission review: %s", problem)
        _call(self._on_error, "malformed")
        return web.Response(status=400, text=f"malformed AdmissionReview: {problem}")

    def _patch(self, admission: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """The JSON patch for one admission request; None for anything but a pod's CREATE."""
        pod = _created_pod(admission)
        if pod is None:
            return None
        patch = gate_patch(pod, now=self._clock())
        group = group_of(pod)
        if patch is None or group is None:
            return None
        namespace, name = _pod_name(admission, pod)
        log.info(
            "gated pod %s/%s of PodGroup %s (%s)",
            namespace,
            name,
            group.name,
            group.api_group,
            extra={
                "namespace": namespace,
                "pod": name,
                "pod_group": group.name,
                "pod_group_api": group.api_group,
            },
        )
        _call(self._on_gated, group.api_group)
        return patch

    def _warnings(self, admission: Mapping[str, Any]) -> tuple[str, ...]:
        """What the answer warns of (gating.admission_warnings): a pod being created that
        gangcheck cannot hold as it asks. Logged too: a pod a controller creates (a Job's)
        has its warnings go to that controller, not to a person."""
        pod = _created_pod(admission)
        if pod is None:
            return ()
        warnings = admission_warnings(pod)
        if warnings:
            namespace, name = _pod_name(admission, pod)
            for warning in warnings:
                log.warning(
                    "pod %s/%s: %s",
                    namespace,
                    name,
                    warning,
                    extra={"namespace": namespace, "pod": name},
                )
        return warnings


def _created_pod(admission: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod of a pod's CREATE; None for any other request."""
    if admission.get("operation") != "CREATE" or admission.get("subResource"):
        return None
    resource = admission.get("resource")
    if not isinstance(resource, Mapping) or dict(resource) != _PODS:
        return None
    pod = admission.get("object")
    return pod if isinstance(pod, Mapping) else None


def _pod_name(admission: Mapping[str, Any], pod: Mapping[str, Any]) -> tuple[str, str]:
    """The pod's namespace and name as the review tells them."""
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    namespace = admission.get("namespace") or meta.get("namespace") or ""
    # A name from generateName is only given after admission.
    name = admission.get("name") or meta.get("name") or f"{meta.get('generateName', '')}*"
    return str(namespace), str(name)


def _problem(review: object) -> str | None:
    """What makes this no AdmissionReview v1 with a request to answer; None when it is one."""
    if not isinstance(review, Mapping):
        return "the body is not a JSON object"
    if review.get("apiVersion") != REVIEW_API_VERSION or review.get("kind") != REVIEW_KIND:
        return f"expected apiVersion {REVIEW_API_VERSION} and kind {REVIEW_KIND}"
    admission = review.get("request")
    if not isinstance(admission, Mapping):
        return "the review has no request"
    uid = admission.get("uid")
    if not isinstance(uid, str) or not uid:
        return "the request has no uid"
    return None
