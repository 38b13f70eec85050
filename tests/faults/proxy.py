"""A fault-injecting HTTP proxy between gangcheck and the test bed's real kube-apiserver.

gangcheck talks plain HTTP to the proxy (a kubeconfig of its own per replica, so every call
is known by the replica that made it); the proxy forwards to kube-apiserver over TLS with the
test bed's admin credentials, impersonating gangcheck's ServiceAccount (``Impersonate-User``;
installed with the shipped RBAC and admission policies, testbed/identity.py), so gangcheck's
calls meet what they meet in a cluster installed from the manifests. On the way it injects
what a real cluster does to a client and a real server cannot do on demand: 5xx answers, 429
with Retry-After, connections reset before the request is sent, answers lost *after* the
write was applied, watches cut or left silent, a 404 on a list or watch (the resource "not
served"), calls that hang, and an outage.

Faults are chosen by rules (a fixed plan, for one defect's test) or at rates from a seeded
random generator (the fault suite); every fault injected is counted by kind, and every write
that reached the server is logged with the replica, the time it was sent and the time its
answer came, so tests can compare writes with lease holders.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import re
import ssl
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from gangcheck_dev.testbed.identity import HARNESS, Identity, ensure_identity

READS = frozenset({"GET", "HEAD"})
HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}
)

STATUS = "status"
"""Answer with a status (500, 503, 429 + Retry-After, 404 'not served') without forwarding."""
RESET = "reset"
"""Close the connection before the request reaches the server."""
LOSE = "lose"
"""Forward, let the server apply it, then close the connection instead of answering."""
HANG = "hang"
"""Never answer (until the proxy stops or the client gives up)."""
CUT = "cut"
"""A watch forwarded, then cut after `after` seconds."""
STALL = "stall"
"""A watch answered 200 that then brings nothing: no event, no bookmark."""
EMPTY = "empty"
"""A list forwarded, answered with its items left out (a cache that lags behind)."""


@dataclass
class Rule:
    """Inject `kind` into the calls matching method and path (a regex), for `times` calls
    (None: every one), for one replica or all."""

    kind: str
    path: str = ""
    methods: frozenset[str] = frozenset()
    watch: bool | None = None
    replica: str | None = None
    times: int | None = None
    status: int = 500
    retry_after: int | None = None
    after: float = 0.0

    def matches(self, replica: str, method: str, path: str, watch: bool) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if self.replica is not None and self.replica != replica:
            return False
        if self.methods and method not in self.methods:
            return False
        if self.watch is not None and self.watch != watch:
            return False
        return re.search(self.path, path) is not None


@dataclass
class Rates:
    """Random faults, each call drawing once: the chance of each kind."""

    errors_500: float = 0.0
    throttled_429: float = 0.0
    resets: float = 0.0
    lost_answers: float = 0.0
    watch_cuts: float = 0.0
    not_found: float = 0.0
    """A 404 on a list or watch of a Workload (the 'resource not served' answer)."""
    not_found_path: str = r"/workloads"


@dataclass(frozen=True)
class Write:
    """One call the server answered (reads too, despite the name)."""

    replica: str
    method: str
    path: str
    status: int
    sent: float
    answered: float
    name: str = ""
    """The object's name: the last segment of the path, or for a create, the body's."""


@dataclass
class Faults:
    """What one or more proxies share: the rules, the rates, the counts and the write log."""

    seed: int = 0
    rates: Rates = field(default_factory=Rates)
    rules: list[Rule] = field(default_factory=list)
    injected: Counter[str] = field(default_factory=Counter)
    log: list[tuple[float, str, str, str, str]] = field(default_factory=list)
    """Every fault injected: (monotonic time, kind, replica, method, path)."""
    calls: list[Write] = field(default_factory=list)
    """Every call forwarded to the server (watches excepted), reads and writes."""
    refused: list[str] = field(default_factory=list)
    """Every write the server refused as forbidden (RBAC) or by an admission policy, with its
    message; not the 403s of a kube-apiserver whose RBAC informers are still filling after a
    restart (their message lists the roles it could not find, "RBAC: [...]")."""
    down: bool = False
    """Every call is refused (connection reset), as while kube-apiserver restarts."""
    enabled: bool = True

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    @property
    def writes(self) -> list[Write]:
        """The writes that reached the server, with the replica and their times."""
        return [c for c in self.calls if c.method not in READS]

    def choose(self, replica: str, method: str, path: str, watch: bool) -> Rule | None:
        rule = self._choose(replica, method, path, watch)
        if rule is not None:
            label = "outage" if self.down else _label(rule)
            self.injected[label] += 1
            self.log.append((time.monotonic(), label, replica, method, path))
        return rule

    def _choose(self, replica: str, method: str, path: str, watch: bool) -> Rule | None:
        if not self.enabled:
            return None
        if self.down:
            return Rule(RESET)
        for rule in self.rules:
            if rule.matches(replica, method, path, watch):
                if rule.times is not None:
                    rule.times -= 1
                return rule
        return self._random(method, path, watch)

    def _random(self, method: str, path: str, watch: bool) -> Rule | None:
        r, draw = self.rates, self.rng.random()
        if "/leases/" in path:
            return None  # leader churn has its own scenario; lease faults make it at random
        chances: list[tuple[float, Rule]] = [
            (r.errors_500, Rule(STATUS, status=500)),
            (r.throttled_429, Rule(STATUS, status=429, retry_after=1)),
            (r.resets, Rule(RESET)),
        ]
        if method not in READS:
            chances.append((r.lost_answers, Rule(LOSE)))
        if watch:
            chances.append((r.watch_cuts, Rule(CUT, after=self.rng.uniform(0.5, 5))))
        if method == "GET" and re.search(r.not_found_path + r"(\?|$)", path):
            chances.append((r.not_found, Rule(STATUS, status=404)))
        for chance, rule in chances:
            if draw < chance:
                return rule
            draw -= chance
        return None


def _label(rule: Rule) -> str:
    if rule.kind == STATUS:
        return f"{rule.status}" + (" Retry-After" if rule.retry_after is not None else "")
    names = {LOSE: "answer lost", CUT: "watch cut", STALL: "watch stalled", EMPTY: "list emptied"}
    return names.get(rule.kind, rule.kind)


class FaultProxy:
    """One replica's door to kube-apiserver; start() then kubeconfig() for gangcheck."""

    def __init__(
        self,
        upstream_kubeconfig: Path,
        faults: Faults,
        *,
        replica: str,
        identity: Identity | None = HARNESS,
    ) -> None:
        """``identity``: whom every call is made as (None: the admin of the kubeconfig)."""
        self.faults = faults
        self.replica = replica
        self.identity = identity
        self._upstream_kubeconfig = upstream_kubeconfig
        self._upstream = yaml.safe_load(upstream_kubeconfig.read_text())
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._pki = tempfile.TemporaryDirectory(prefix="gangcheck-proxy-")
        self._streams: dict[asyncio.Transport, str] = {}
        self.port = 0

    @property
    def server(self) -> str:
        cluster = self._upstream["clusters"][0]["cluster"]
        return str(cluster["server"])

    async def start(self) -> FaultProxy:
        if self.identity is not None:
            await asyncio.to_thread(ensure_identity, self._upstream_kubeconfig, self.identity)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl()),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    def cut(self, path: str) -> int:
        """Cut the open watches whose path matches; how many were cut."""
        cut = [t for t, p in self._streams.items() if re.search(path, p)]
        for transport in cut:
            transport.abort()
            self.faults.injected["watch cut"] += 1
            self.faults.log.append((time.monotonic(), "watch cut", self.replica, "GET", path))
        return len(cut)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        self._pki.cleanup()

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig that sends gangcheck through this proxy (plain HTTP, no credentials:
        the proxy adds the test bed's, and the identity it impersonates)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": self.replica, "user": {}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": self.replica}}],
            "current-context": "proxy",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def _ssl(self) -> ssl.SSLContext:
        cluster = self._upstream["clusters"][0]["cluster"]
        user = self._upstream["users"][0]["user"]
        folder = Path(self._pki.name)
        for name, key in (
            ("ca.crt", cluster["certificate-authority-data"]),
            ("client.crt", user["client-certificate-data"]),
            ("client.key", user["client-key-data"]),
        ):
            (folder / name).write_bytes(base64.b64decode(key))
        context = ssl.create_default_context(cafile=str(folder / "ca.crt"))
        context.load_cert_chain(str(folder / "client.crt"), str(folder / "client.key"))
        return context

    # ---- one call ----------------------------------------------------------------------

    def _headers(self, request: web.Request) -> dict[str, str]:
        """What goes upstream: the client's headers (no impersonation of its own), and the
        identity's name to impersonate."""
        headers = {
            k: v
            for k, v in _upstream_headers(request.headers).items()
            if not k.lower().startswith("impersonate-")
        }
        if self.identity is not None:
            headers["Impersonate-User"] = self.identity.username
        return headers

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        watch = request.query.get("watch") in ("true", "1")
        rule = self.faults.choose(self.replica, request.method, request.path, watch)
        body = await request.read()
        if rule is not None and rule.kind == STATUS:
            return _status(rule)
        if rule is not None and rule.kind == RESET:
            return _reset(request)
        if rule is not None and rule.kind == HANG:
            await asyncio.Event().wait()
        if watch:
            return await self._stream(request, rule)
        return await self._forward(request, body, rule)

    async def _forward(self, request: web.Request, body: bytes, rule: Rule | None) -> web.Response:
        assert self._session is not None
        sent = time.monotonic()
        async with self._session.request(
            request.method,
            self.server + request.path_qs,
            data=body or None,
            headers=self._headers(request),
        ) as upstream:
            data = await upstream.read()
            headers = _forwarded(upstream.headers)
            status = upstream.status
        self.faults.calls.append(
            Write(
                self.replica,
                request.method,
                request.path,
                status,
                sent,
                time.monotonic(),
                _name_of(request, body),
            )
        )
        if request.method not in READS and _refused(status, data):
            text = data.decode(errors="replace")[:500]
            self.faults.refused.append(f"{self.replica} {request.method} {request.path}: {text}")
        if rule is not None and rule.kind == LOSE:
            return _reset(request)
        if rule is not None and rule.kind == EMPTY and status == 200:
            data = json.dumps({**json.loads(data), "items": []}).encode()
        return web.Response(status=status, body=data, headers=headers)

    async def _stream(self, request: web.Request, rule: Rule | None) -> web.StreamResponse:
        assert self._session is not None
        response = web.StreamResponse()
        if rule is not None and rule.kind == STALL:
            response.content_type = "application/json"
            await response.prepare(request)
            await asyncio.Event().wait()
        async with self._session.get(
            self.server + request.path_qs, headers=self._headers(request)
        ) as upstream:
            response.set_status(upstream.status)
            response.headers.update(_forwarded(upstream.headers))
            await response.prepare(request)
            if request.transport is not None:
                self._streams[request.transport] = request.path
            cutting = rule is not None and rule.kind == CUT
            cut_at = time.monotonic() + rule.after if rule is not None and cutting else None
            try:
                await _pump(upstream, response, cut_at)
            except (ConnectionResetError, aiohttp.ClientError):
                return response  # cut by cut(), or the client left
            finally:
                if request.transport is not None:
                    self._streams.pop(request.transport, None)
        if cut_at is not None:
            return _reset(request)
        await response.write_eof()
        return response


async def _pump(
    upstream: aiohttp.ClientResponse, response: web.StreamResponse, cut_at: float | None
) -> None:
    """Copy the watch stream, until its end or until `cut_at`."""
    while True:
        wait = None if cut_at is None else max(0.0, cut_at - time.monotonic())
        try:
            chunk = await asyncio.wait_for(upstream.content.readany(), wait)
        except TimeoutError:
            return
        if not chunk:
            return
        await response.write(chunk)


def _name_of(request: web.Request, body: bytes) -> str:
    if request.method != "POST":
        return request.path.rstrip("/").rsplit("/", 1)[-1]
    try:
        return str(json.loads(body)["metadata"]["name"])
    except (ValueError, KeyError, TypeError):
        return ""


def _refused(status: int, body: bytes) -> bool:
    """Refused by RBAC or by an admission policy (not by an authorizer still warming up)."""
    if b"ValidatingAdmissionPolicy" in body:
        return status in (403, 422)
    return status == 403 and b"RBAC: [" not in body


def _forwarded(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_HEADERS}


def _upstream_headers(headers: Any) -> dict[str, str]:
    """The client's headers, asking the server for an uncompressed answer: the proxy passes
    bodies on as they come (and reads lists to empty them), and its own HTTP client would
    otherwise ask for gzip, which kube-apiserver uses for answers over 128 KiB."""
    kept = {k: v for k, v in _forwarded(headers).items() if k.lower() != "accept-encoding"}
    return {**kept, "Accept-Encoding": "identity"}


def _status(rule: Rule) -> web.Response:
    reason = {404: "NotFound", 429: "TooManyRequests", 503: "ServiceUnavailable"}.get(
        rule.status, "InternalError"
    )
    message = (
        "the server could not find the requested resource"
        if rule.status == 404
        else f"injected {rule.status}"
    )
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {},
        "code": rule.status,
    }
    headers = {"Retry-After": str(rule.retry_after)} if rule.retry_after is not None else {}
    return web.json_response(body, status=rule.status, headers=headers)


def _reset(request: web.Request) -> web.Response:
    if request.transport is not None:
        request.transport.abort()
    raise ConnectionResetError("injected reset")


@contextlib.asynccontextmanager
async def proxies(
    upstream_kubeconfig: Path,
    faults: Faults,
    replicas: list[str],
    folder: Path,
    *,
    identity: Identity | None = HARNESS,
) -> AsyncIterator[list[FaultProxy]]:
    """Started proxies, one per replica, each with its kubeconfig written in `folder`
    (``folder / f"{replica}.kubeconfig"``), forwarding as `identity` (None: the admin)."""
    started = [
        await FaultProxy(upstream_kubeconfig, faults, replica=r, identity=identity).start()
        for r in replicas
    ]
    try:
        for proxy in started:
            proxy.kubeconfig(folder / f"{proxy.replica}.kubeconfig")
        yield started
    finally:
        for proxy in started:
            await proxy.stop()
