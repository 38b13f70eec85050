"""Kubeconfig files for the test bed (credentials embedded, so the file stands alone)."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

CONTEXT = "gangcheck"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig(*, server: str, ca: Path, cert: Path, key: Path, user: str) -> dict[str, object]:
    """A kubeconfig with one cluster, one client-certificate user and one context."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CONTEXT,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)},
            }
        ],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": user}}],
        "current-context": CONTEXT,
        "preferences": {},
    }


def write_kubeconfig(
    path: Path, *, server: str, ca: Path, cert: Path, key: Path, user: str
) -> Path:
    config = kubeconfig(server=server, ca=ca, cert=cert, key=key, user=user)
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
