"""The CustomResourceDefinitions the test bed installs.

Third-party CRDs are read from the Go module cache of the modules pinned in ``hack/crds/go.mod``
(never copied into the repository); ours are the ``*.yaml`` files in ``manifests/crd/``.
They are installed with server-side apply: Kueue's Workload CRD (1.4 MB of YAML) is too big
for client-side apply's last-applied annotation.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gangcheck_dev.testbed.binaries import repo_root
from gangcheck_dev.testbed.rest import RestClient

CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
FIELD_MANAGER = "gangcheck-testbed"


class CRDError(RuntimeError):
    """A CRD module could not be located or a CRD did not become Established."""


@dataclass(frozen=True)
class CRDSource:
    """CRD files inside a Go module pinned in ``hack/crds/go.mod``: those in ``folder``
    matching the glob ``pattern``."""

    module: str
    folder: str
    pattern: str = "*.yaml"


THIRD_PARTY = (
    CRDSource("sigs.k8s.io/kueue", "config/components/crd/bases"),
    CRDSource("k8s.io/autoscaler/cluster-autoscaler/apis", "config/crd"),
    # Only the PodGroup of the scheduler-plugins coscheduling plugin (not its ElasticQuota).
    CRDSource(
        "sigs.k8s.io/scheduler-plugins",
        "config/crd/bases",
        "scheduling.x-k8s.io_podgroups.yaml",
    ),
)


def module_dir(module: str, wrapper: str = "crds", *, toolchain: str | None = None) -> Path:
    """The module's folder in the Go module cache (downloaded if needed), at the version the
    wrapper module ``hack/<wrapper>`` pins (``toolchain``: the ``GOTOOLCHAIN`` that wrapper's
    go.mod needs, if newer than the machine's Go)."""
    workdir = repo_root() / "hack" / wrapper
    env = {**os.environ, "GOWORK": "off"}
    if toolchain is not None:
        env["GOTOOLCHAIN"] = toolchain
    result = subprocess.run(
        ["go", "mod", "download", "-json", module],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        info = json.loads(result.stdout)
    except json.JSONDecodeError:
        info = {}
    if result.returncode != 0 or "Dir" not in info:
        problem = info.get("Error") or result.stderr.strip() or result.stdout.strip()
        raise CRDError(f"go mod download {module} (in hack/{wrapper}) failed: {problem}")
    return Path(info["Dir"])


def crd_files() -> list[Path]:
    """Every CRD file to install: Kueue, ProvisioningRequest, the scheduler-plugins PodGroup,
    then ``manifests/crd/``."""
    files: list[Path] = []
    for source in THIRD_PARTY:
        folder = module_dir(source.module) / source.folder
        found = sorted(folder.glob(source.pattern))
        if not found:
            raise CRDError(f"no CRDs in {source.module}/{source.folder}/{source.pattern}")
        files.extend(found)
    files.extend(sorted((repo_root() / "manifests" / "crd").glob("*.yaml")))
    return files


def load_crds(files: Iterable[Path]) -> list[dict[str, Any]]:
    """The CustomResourceDefinition documents of ``files`` (other kinds are skipped)."""
    crds: list[dict[str, Any]] = []
    for path in files:
        with path.open("rb") as handle:
            for doc in yaml.load_all(handle, Loader=yaml.CSafeLoader):
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                    crds.append(doc)
    return crds


def _established(crd: dict[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def wait_established(client: RestClient, names: Sequence[str], timeout: float = 60.0) -> None:
    pending = list(names)
    deadline = time.monotonic() + timeout
    while pending:
        pending = [name for name in pending if not _established(client.get(f"{CRD_API}/{name}"))]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise CRDError(f"CRDs not Established after {timeout:.0f}s: {', '.join(pending)}")
        time.sleep(0.1)


def _list_paths(crd: dict[str, Any]) -> list[str]:
    spec = crd["spec"]
    served = [v["name"] for v in spec["versions"] if v.get("served", True)]
    return [f"/apis/{spec['group']}/{v}/{spec['names']['plural']}?limit=1" for v in served]


def wait_listable(client: RestClient, crds: Sequence[dict[str, Any]], timeout: float) -> None:
    """Established is not enough: the resource's storage answers 429 "storage is
    (re)initializing" for a moment after. Waits until every served version lists."""
    pending = [path for crd in crds for path in _list_paths(crd)]
    deadline = time.monotonic() + timeout
    while pending:
        pending = [path for path in pending if client.request("GET", path).status != 200]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise CRDError(f"custom resources not listable after {timeout:.0f}s: {pending}")
        time.sleep(0.1)


def wait_gone(client: RestClient, names: Sequence[str], timeout: float = 60.0) -> None:
    """Waits until none of the CRDs named is there (a deleted CRD stays, terminating, until
    the server has removed its custom resources)."""
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending:
        pending = [n for n in pending if client.request("GET", f"{CRD_API}/{n}").status != 404]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise CRDError(f"CRDs still there {timeout:.0f}s after deletion: {', '.join(pending)}")
        time.sleep(0.1)


def _terminating(client: RestClient, name: str) -> bool:
    found = client.request("GET", f"{CRD_API}/{name}")
    return found.status == 200 and bool(found.json()["metadata"].get("deletionTimestamp"))


def install_crds(
    client: RestClient, crds: Sequence[dict[str, Any]], timeout: float = 60.0
) -> list[str]:
    """Server-side applies every CRD, waits until all are Established and their resources
    answer; returns the CRDs' names. A CRD still terminating (deleted by someone before) is
    waited out first: applied over, it would be removed a moment later."""
    names = []
    for crd in crds:
        name = crd["metadata"]["name"]
        if _terminating(client, name):
            wait_gone(client, [name], timeout)
        client.apply(f"{CRD_API}/{name}", crd, FIELD_MANAGER)
        names.append(name)
    wait_established(client, names, timeout)
    wait_listable(client, crds, timeout)
    return names
