"""A minimal synchronous HTTPS client for the apiserver, for the launcher's own needs only.

The launcher probes readiness, installs CRDs and creates namespaces before any controller runs;
a blocking client on the standard library keeps it independent of the asyncio code.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class APIError(RuntimeError):
    """The apiserver answered with an unexpected status."""

    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        self.status = status
        text = body.decode(errors="replace")[:2000]
        super().__init__(f"{method} {path}: HTTP {status}: {text}")


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def tls_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """Verifies the server against ``ca``; presents a client certificate if given."""
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert), str(key) if key else None)
    return context


class RestClient:
    """Blocking requests to one apiserver; one connection per request (no pooling)."""

    def __init__(self, server: str, context: ssl.SSLContext, timeout: float = 10.0) -> None:
        url = urllib.parse.urlsplit(server)
        if url.scheme != "https" or url.hostname is None:
            raise ValueError(f"expected an https:// server URL, got {server!r}")
        self.host = url.hostname
        self.port = url.port or 443
        self.context = context
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> Response:
        connection = http.client.HTTPSConnection(
            self.host, self.port, context=self.context, timeout=self.timeout
        )
        try:
            headers = {"Accept": "application/json"}
            if body is not None:
                headers["Content-Type"] = content_type
            connection.request(method, path, body=body, headers=headers)
            reply = connection.getresponse()
            return Response(reply.status, reply.read())
        finally:
            connection.close()

    def ok(self, path: str) -> bool:
        """GET ``path`` answered 200; False on any connection or TLS error."""
        try:
            return self.request("GET", path).status == 200
        except (OSError, http.client.HTTPException):
            return False

    def get(self, path: str) -> Any:
        response = self.request("GET", path)
        if response.status != 200:
            raise APIError("GET", path, response.status, response.body)
        return response.json()

    def create(self, path: str, obj: dict[str, Any]) -> Response:
        """POST; an AlreadyExists conflict (409) counts as success."""
        response = self.request("POST", path, json.dumps(obj).encode())
        if response.status not in (200, 201, 202, 409):
            raise APIError("POST", path, response.status, response.body)
        return response

    def apply(self, path: str, obj: dict[str, Any], field_manager: str) -> Any:
        """Server-side apply (``force``: the test bed owns what it installs)."""
        query = urllib.parse.urlencode({"fieldManager": field_manager, "force": "true"})
        full = f"{path}?{query}"
        body = json.dumps(obj, separators=(",", ":")).encode()
        response = self.request("PATCH", full, body, "application/apply-patch+yaml")
        if response.status not in (200, 201):
            raise APIError("PATCH", full, response.status, response.body)
        return response.json()
