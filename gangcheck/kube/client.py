"""The only way gangcheck talks to the API server: raw JSON over kubernetes-asyncio's client.

Objects stay plain dicts (``model/`` gives typed views of them). Transient failures (429, 5xx,
a dropped connection) are retried here, briefly, with tenacity: after the server's Retry-After
when it gives one, else after an exponential backoff with full jitter (so replicas and
informers that failed together do not retry together). Everything else is raised as an
``ApiError`` subclass for the caller (and the work queue's backoff) to handle.

A client may carry a write fence (leader election): every write asks it first, is refused
(``FencedError``) when this replica holds no lease known to be valid, and is sent with a
timeout that ends before the lease could expire.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import os
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

import aiohttp
import yaml
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)
from tenacity import RetryCallState as _RetryState
from yarl import URL

from gangcheck.kube.errors import (
    InvalidError,
    NotFoundError,
    ReplacedError,
    TransientError,
    error_from_status,
    replaced,
    unapplied,
)
from gangcheck.kube.resources import Resource
from gangcheck.model.objects import Obj
from gangcheck.telemetry import api_call

log = logging.getLogger(__name__)

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

WriteFence = Callable[[], float]
"""Seconds a write may still take; raises ``FencedError`` when no write may be sent."""
READS = frozenset({"GET", "HEAD"})
REQUEST_TIMEOUT = 30.0
MAX_RETRY_AFTER = 10.0
"""The longest wait a Retry-After may impose on one call before it is tried again."""
WATCH_QUIET_SECONDS = 90.0
"""A watch that brought nothing, not even a bookmark (the API server sends one about every
minute), for this long is stalled: it is ended so the informer watches again."""


AnswerObserver = Callable[[str, int], None]
"""Told of each request: its HTTP method, and the status answered (0: no answer)."""


class KubeconfigError(ValueError):
    """The kubeconfig (or the in-cluster configuration) is missing or cannot be used."""


class Kube:
    """A thin asynchronous client of the Kubernetes REST API, speaking JSON dicts."""

    def __init__(
        self,
        api_client: Any,
        *,
        retry_attempts: int = 5,
        retry_seconds: float = 15,
        fence: WriteFence | None = None,
        observe: AnswerObserver | None = None,
    ) -> None:
        self._api = api_client
        self._retry_attempts = retry_attempts
        self._retry_seconds = retry_seconds
        self._fence = fence
        self._observe = observe

    def fenced(self, fence: WriteFence) -> Kube:
        """The same connection, every write of which asks `fence` first."""
        return Kube(
            self._api,
            retry_attempts=self._retry_attempts,
            retry_seconds=self._retry_seconds,
            fence=fence,
            observe=self._observe,
        )

    def observed(self, observe: AnswerObserver) -> Kube:
        """The same connection, each request of which (each try of a retried one, each
        watch) is told to `observe`: its HTTP method and the status answered (0: none)."""
        return Kube(
            self._api,
            retry_attempts=self._retry_attempts,
            retry_seconds=self._retry_seconds,
            fence=self._fence,
            observe=observe,
        )

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | None = None,
        *,
        in_cluster: bool = False,
        retry_attempts: int = 5,
        retry_seconds: float = 15,
    ) -> Kube:
        """Connect with a kubeconfig file, or with the pod's service account when in a cluster;
        transient failures of a call are retried `retry_attempts` times within
        `retry_seconds`. A kubeconfig that is missing or cannot be used raises
        ``KubeconfigError`` (one line, for the command line to print)."""
        configuration = k8s_client.Configuration()
        with contextlib.ExitStack() as in_memory:  # the TLS files live until the client is made
            if in_cluster:
                _load_in_cluster(configuration)
            else:
                await _load_kubeconfig(kubeconfig, configuration, in_memory)
            try:
                api = k8s_client.ApiClient(configuration=configuration)
            except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
                raise KubeconfigError(f"unusable TLS material in the kubeconfig: {e}") from e
        _environment_read_once(api)
        return cls(api, retry_attempts=retry_attempts, retry_seconds=retry_seconds)

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    async def close(self) -> None:
        await self._api.close()
        # TLS transports finish closing on later loop iterations; give them that time so no
        # socket outlives the client (aiohttp's documented graceful shutdown).
        await asyncio.sleep(0.25)

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # ---- verbs -------------------------------------------------------------------------

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> Obj:
        return await self.request("GET", res.object_path(name, namespace))

    async def get_if_exists(
        self, res: Resource, name: str, namespace: str | None = None
    ) -> Obj | None:
        """The object, or None only when the server says this very object does not exist.

        A 404 that does not name the object (the resource not served, a proxy's answer) proves
        nothing about it and is raised: absence is never inferred from it.
        """
        try:
            return await self.get(res, name, namespace)
        except NotFoundError as e:
            if e.names_object(name):
                return None
            raise

    async def list_objects(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Obj:
        query = {
            k: v
            for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector))
            if v
        }
        return await self.request("GET", res.collection_path(namespace), query=query or None)

    async def create(self, res: Resource, body: Obj, namespace: str | None = None) -> Obj:
        ns = namespace or body.get("metadata", {}).get("namespace")
        body = {"apiVersion": res.api_version, "kind": res.kind, **body}
        return await self.request("POST", res.collection_path(ns), body=body)

    async def replace(self, res: Resource, body: Obj, *, subresource: str | None = None) -> Obj:
        meta = body["metadata"]
        path = _sub(res.object_path(meta["name"], meta.get("namespace")), subresource)
        return await self.request("PUT", path, body=body)

    async def merge_patch(
        self,
        res: Resource,
        name: str,
        patch: Obj,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        uid: str | None = None,
    ) -> Obj:
        """Merge `patch` into the object. With `uid`, only into the object of that uid: one
        deleted and made again under its name since it was read is left as it is, and the
        write raises ReplacedError, a ConflictError (the uid rides in the patch, and
        kube-apiserver refuses to change it: `replaced`)."""
        path = _sub(res.object_path(name, namespace), subresource)
        if uid:
            patch = {**patch, "metadata": {**(patch.get("metadata") or {}), "uid": uid}}
        try:
            return await self.request("PATCH", path, body=patch, content_type=MERGE_PATCH)
        except InvalidError as e:
            if replaced(e):
                message = f"uid mismatch: {e.message}"
                raise ReplacedError(409, "Conflict", message, target=path) from e
            raise

    async def json_patch(
        self,
        res: Resource,
        name: str,
        ops: list[Obj],
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> Obj:
        """Apply the JSON patch `ops`. One that did not apply to the object as it is now (a
        ``test`` op failed, a path gone) raises ChangedError, a ConflictError; a refusal
        (`refused`) raises as answered (`unapplied`)."""
        path = _sub(res.object_path(name, namespace), subresource)
        try:
            return await self.request("PATCH", path, body=ops, content_type=JSON_PATCH)
        except InvalidError as e:
            raise unapplied(e, path) from e

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        uid: str | None = None,
        grace_period_seconds: int | None = None,
    ) -> Obj:
        """Delete, optionally only if the object still has this resourceVersion / uid."""
        preconditions = {
            k: v for k, v in (("resourceVersion", resource_version), ("uid", uid)) if v
        }
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if preconditions:
            body["preconditions"] = preconditions
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        return await self.request("DELETE", res.object_path(name, namespace), body=body)

    async def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        resource_version: str,
        timeout_seconds: int = 300,
        label_selector: str | None = None,
        quiet_seconds: float = WATCH_QUIET_SECONDS,
        opened: Callable[[], None] | None = None,
    ) -> AsyncGenerator[Obj]:
        """Yield watch events ({type, object}) from resource_version until the server ends it.

        Bookmarks are asked for; a watch quiet for `quiet_seconds` (no event, no bookmark) is
        taken as stalled and raised as a TransientError rather than waited on to its end.
        `opened` is called once the server has answered the watch (before its first event).
        """
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if label_selector:
            query["labelSelector"] = label_selector
        path = res.collection_path(namespace)
        resp = await self._send("GET", path, query=query, timeout=timeout_seconds + 30)
        try:
            if resp.status >= 300:
                raise _error_of(resp, await resp.read(), target=path)
            if opened is not None:
                opened()
            while line := await _next_line(resp, quiet_seconds, target=path):
                if not line.endswith(b"\n"):  # the stream ended inside an event: cut
                    raise TransientError(0, "WatchBroken", "cut inside an event", target=path)
                if line.strip():
                    yield json.loads(line)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise TransientError(0, "WatchBroken", str(e) or type(e).__name__, target=path) from e
        finally:
            resp.close()

    # ---- plumbing ----------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
    ) -> Obj:
        """One API call, retried on transient failures; returns the decoded JSON body."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(TransientError),
            stop=stop_after_attempt(self._retry_attempts) | stop_after_delay(self._retry_seconds),
            wait=_wait_as_told,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._request_once(method, path, query, body, content_type)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _request_once(
        self, method: str, path: str, query: Mapping[str, str] | None, body: Any, content_type: str
    ) -> Obj:
        timeout = REQUEST_TIMEOUT
        if self._fence is not None and method not in READS:
            timeout = min(timeout, self._fence())
        with api_call(method, path) as answered:
            resp = await self._send(
                method, path, query=query, body=body, content_type=content_type, timeout=timeout
            )
            try:
                data = await resp.read()
            except (aiohttp.ClientError, TimeoutError) as e:
                raise TransientError(0, "ConnectionError", str(e), target=path) from e
            finally:
                resp.release()
            answered(resp.status)
            if resp.status >= 300:
                raise _error_of(resp, data, target=f"{method} {path}")
        parsed: Obj = json.loads(data) if data else {}
        return parsed

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float = REQUEST_TIMEOUT,
    ) -> Any:
        headers = {"Accept": JSON, "Content-Type": content_type}
        auth = await self._api.configuration.auth_settings()
        if "BearerToken" in auth:
            headers["authorization"] = auth["BearerToken"]["value"]
        url = self._api.configuration.host + path
        try:
            resp = await self._api.rest_client.request(
                method,
                url,
                query_params=list((query or {}).items()),
                headers=headers,
                body=body,
                _preload_content=False,
                _request_timeout=timeout,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            if self._observe is not None:
                self._observe(method, 0)
            raise TransientError(
                0, "ConnectionError", str(e) or type(e).__name__, target=path
            ) from e
        if self._observe is not None:
            self._observe(method, resp.status)
        return resp


def _environment_read_once(api: Any) -> None:
    """Read the proxy variables (HTTPS_PROXY, NO_PROXY, ...) for the API server once, here,
    rather than on every request: kubernetes-asyncio's session trusts the environment, and
    aiohttp then looks up the proxy variables and ``~/.netrc`` in a worker thread for each
    request (a quarter of the controller's CPU samples at N = 2,000 gangs). A proxy the
    kubeconfig names wins; ``~/.netrc`` is not read (the kubeconfig carries the credentials)."""
    rest = api.rest_client
    if not rest.proxy:
        with contextlib.suppress(LookupError):
            proxy, proxy_auth = get_env_proxy_for_url(URL(api.configuration.host))
            rest.proxy = str(proxy)
            if proxy_auth is not None:
                rest.proxy_headers = {"Proxy-Authorization": proxy_auth.encode()}
    # aiohttp has no public setter: the flag is read per request, and only there
    rest.pool_manager._trust_env = False


_JITTERED = wait_random_exponential(multiplier=0.2, max=3)


def _wait_as_told(state: _RetryState) -> float:
    """The server's Retry-After (capped) if it gave one, else exponential with full jitter."""
    error = state.outcome.exception() if state.outcome is not None else None
    asked = getattr(error, "retry_after", None)
    if asked is not None:
        return float(min(asked, MAX_RETRY_AFTER))
    return float(_JITTERED(state))


def _error_of(resp: Any, body: bytes, *, target: str) -> Exception:
    headers = getattr(resp, "headers", None) or {}
    return error_from_status(
        resp.status, body, target=target, retry_after=headers.get("Retry-After")
    )


async def _next_line(resp: Any, quiet_seconds: float, *, target: str) -> bytes:
    """The next line of a watch, b"" at its end; TransientError if none comes in time."""
    try:
        async with asyncio.timeout(quiet_seconds):
            line: bytes = await resp.content.readline()
    except TimeoutError as e:
        raise TransientError(
            0, "WatchStalled", f"nothing for {quiet_seconds:g}s, not even a bookmark", target=target
        ) from e
    return line


def _sub(path: str, subresource: str | None) -> str:
    return f"{path}/{subresource}" if subresource else path


# ---- configuration ---------------------------------------------------------------------

#: Embedded TLS material of a kubeconfig: ``<field>-data`` (base64) stands in for ``<field>``.
_EMBEDDED = {"cluster": ("certificate-authority",), "user": ("client-certificate", "client-key")}


def _load_in_cluster(configuration: Any) -> None:
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except k8s_config.ConfigException as e:
        raise KubeconfigError(f"cannot use the in-cluster configuration: {_one_line(e)}") from e


async def _load_kubeconfig(path: str | None, configuration: Any, in_memory: Any) -> None:
    """Load a kubeconfig (``path``, else $KUBECONFIG, else ~/.kube/config) with its embedded
    certificates and key held in memory files: the client library would write each to a
    temporary file, which a read-only root without a writable /tmp refuses."""
    location = path or os.environ.get("KUBECONFIG") or "~/.kube/config"
    try:
        merged = _read_kubeconfig(path, location, in_memory)
        loader = k8s_config.kube_config.KubeConfigLoader(config_dict=merged)
        await loader.load_and_set(configuration)
    except KubeconfigError:
        raise
    except (k8s_config.ConfigException, yaml.YAMLError, OSError, ValueError, TypeError) as e:
        raise KubeconfigError(f"cannot load the kubeconfig {location}: {_one_line(e)}") from e


def _read_kubeconfig(path: str | None, location: str, in_memory: Any) -> Any:
    """The merged kubeconfig (the library's own merge of $KUBECONFIG's files), embedded TLS
    material moved to memory files."""
    if path is not None and not os.path.isfile(path):
        raise KubeconfigError(f"kubeconfig {path} not found")
    files = [os.path.expanduser(p) for p in location.split(os.pathsep) if p]
    # Said here, in one line: the library would log its own warning first.
    merged = (
        k8s_config.kube_config.KubeConfigMerger(location).config
        if any(os.path.exists(f) for f in files)
        else None
    )
    if merged is None:
        raise KubeconfigError(f"no kubeconfig at {location} (give --kubeconfig or --in-cluster)")
    for section, fields in _EMBEDDED.items():
        for entry in merged.value.get(f"{section}s") or []:
            body = getattr(entry, "value", entry).get(section)
            if isinstance(body, dict):
                _embedded_to_memory(body, fields, in_memory)
    return merged


def _embedded_to_memory(body: dict[str, Any], fields: tuple[str, ...], in_memory: Any) -> None:
    """``<field>-data`` becomes ``<field>``: the path of an anonymous in-memory file."""
    if not hasattr(os, "memfd_create"):  # not Linux: the library's temporary files
        return
    for field in fields:
        data = body.get(f"{field}-data")
        if not data:
            continue
        try:
            content = base64.standard_b64decode(data)
        except (binascii.Error, TypeError) as e:
            raise KubeconfigError(f"{field}-data is not base64: {e}") from e
        body[field] = _memory_file(content, in_memory)
        del body[f"{field}-data"]


def _memory_file(content: bytes, in_memory: Any) -> str:
    """A path that reads `content` from memory (memfd); closed when `in_memory` closes."""
    fd = os.memfd_create("gangcheck-kubeconfig", os.MFD_CLOEXEC)
    in_memory.callback(os.close, fd)
    view = memoryview(content)
    while view:
        view = view[os.write(fd, view) :]
    return f"/proc/self/fd/{fd}"


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
