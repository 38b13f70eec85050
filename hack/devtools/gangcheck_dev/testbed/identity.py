"""gangcheck's ServiceAccount on a cluster, with what the shipped manifests give it and nothing
of the admin's: the RBAC of ``manifests/base`` plus components, and the base's admission
policies (the ServiceAccount's: it may write only what gangcheck writes).

:func:`install_identity` applies them (idempotent, server-side) and waits until the API server
grants the account its rules; :func:`identity_kubeconfig` writes a kubeconfig holding only a
token of the account (TokenRequest API). Run with that kubeconfig, or through a proxy that
impersonates :attr:`Identity.username`, every write gangcheck makes meets the same RBAC and
policies as in a cluster installed from the manifests, so a suite that passes proves none of
them refuses gangcheck's own writes.

An identity in another namespace than the base's (``gangcheck-system``) is the base moved
there as a Helm release of another name would be: its namespaced objects in that namespace,
its ClusterRole, binding and policies named after the namespace, the policies matching that
account. Tests use one of their own, so that installing or removing the base as a person
would (tests/integration/test_manifests.py) neither sees nor removes it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gangcheck_dev.testbed.deploy import (
    NAMESPACE,
    SERVICE_ACCOUNT,
    DeployError,
    _kubectl,
    _service_account_token,
    _token_kubeconfig,
    find_kubectl,
    kustomize_objects,
)

__all__ = [
    "ALL_COMPONENTS",
    "HARNESS",
    "Identity",
    "ensure_identity",
    "identity_kubeconfig",
    "identity_objects",
    "install_identity",
]

#: Every component of manifests/components that grants the controller something.
ALL_COMPONENTS = ("reclaim-delete-node", "reclaim-nodeclaim", "reclaim-capi", "karpenter")
_RBAC_KINDS = frozenset(
    {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
)
_POLICY_KINDS = frozenset({"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"})
_OWN_POLICY = "gangcheck-writes-only-its-own"
_GUARD_POLICY = "gangcheck-guards-its-records"
_FENCE_POLICY = "gangcheck-fence"
_FIELD_MANAGER = "gangcheck-identity"
_GRANT_TIMEOUT = 30.0


@dataclass(frozen=True)
class Identity:
    """A ServiceAccount gangcheck runs as."""

    namespace: str = NAMESPACE
    account: str = SERVICE_ACCOUNT

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.account}"

    @property
    def moved(self) -> bool:
        return self.namespace != NAMESPACE


HARNESS = Identity("gangcheck-harness")
"""The identity the test harnesses run gangcheck as (tests/integration/harness.py, the fault
proxy): the base moved to a namespace of its own."""


def identity_objects(
    identity: Identity,
    *,
    workdir: Path,
    components: Sequence[str] = ALL_COMPONENTS,
    fence: bool = True,
    kubectl: Path | None = None,
) -> list[dict[str, Any]]:
    """The RBAC of ``manifests/base`` + ``components`` and the base's admission policies (and
    the fence policy, with ``fence``: it is every writer's, so it is never moved), for
    ``identity``."""
    kubectl = kubectl or find_kubectl()
    rendered = kustomize_objects(kubectl, workdir, components)
    objects = [
        o
        for o in rendered
        if o.get("kind") in _RBAC_KINDS
        or (o.get("kind") in _POLICY_KINDS and (fence or o["metadata"]["name"] != _FENCE_POLICY))
    ]
    if not identity.moved:
        return objects
    return [_moved(o, identity) for o in objects]


def _moved(obj: dict[str, Any], identity: Identity) -> dict[str, Any]:
    """``obj`` of the base, for an identity in another namespace."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind in _POLICY_KINDS and name == _FENCE_POLICY:
        return obj
    text = yaml.safe_dump(obj).replace(
        f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}", identity.username
    )
    moved: dict[str, Any] = yaml.safe_load(
        text.replace(_OWN_POLICY, f"{identity.namespace}-writes-only-its-own").replace(
            _GUARD_POLICY, f"{identity.namespace}-guards-its-records"
        )
    )
    meta = moved["metadata"]
    if kind == "Namespace":
        meta["name"] = identity.namespace
    elif kind in ("ClusterRole", "ClusterRoleBinding"):
        meta["name"] = identity.namespace
        meta.pop("namespace", None)
    elif kind in _POLICY_KINDS:
        meta.pop("namespace", None)
    else:
        meta["namespace"] = identity.namespace
    if kind == "ServiceAccount":
        meta["name"] = identity.account
    if kind == "ClusterRoleBinding":
        moved["roleRef"]["name"] = identity.namespace
    for subject in moved.get("subjects") or []:
        if subject.get("kind") == "ServiceAccount":
            subject.update(name=identity.account, namespace=identity.namespace)
    return moved


def install_identity(
    kubeconfig: Path,
    identity: Identity = HARNESS,
    *,
    workdir: Path,
    components: Sequence[str] = ALL_COMPONENTS,
    fence: bool = True,
    kubectl: Path | None = None,
) -> None:
    """Apply :func:`identity_objects` with ``kubeconfig`` (an admin's), the Namespace first,
    and return once the API server grants the account its rules (RBAC is read from an
    informer: a write made before would be refused)."""
    kubeconfig = Path(kubeconfig)
    kubectl = kubectl or find_kubectl()
    objects = identity_objects(
        identity, workdir=workdir, components=components, fence=fence, kubectl=kubectl
    )
    first = [o for o in objects if o["kind"] == "Namespace"]
    _apply_as(kubectl, kubeconfig, first)
    _apply_as(kubectl, kubeconfig, [o for o in objects if o not in first])
    deadline = time.monotonic() + _GRANT_TIMEOUT
    while not _granted(kubectl, kubeconfig, identity):
        if time.monotonic() > deadline:
            raise DeployError(f"{identity.username} was not granted its rules within 30 s")
        time.sleep(0.1)


def _apply_as(kubectl: Path, kubeconfig: Path, objects: list[dict[str, Any]]) -> None:
    stream = yaml.safe_dump_all(objects, sort_keys=False)
    args = ("apply", "--server-side", "--force-conflicts", f"--field-manager={_FIELD_MANAGER}")
    _kubectl(kubectl, kubeconfig, *args, "-f", "-", stdin=stream)


def _granted(kubectl: Path, kubeconfig: Path, identity: Identity) -> bool:
    """Whether the account may patch Workload status yet (a rule of the base's last
    ClusterRole), as the authorizer answers it."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": identity.username,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{identity.namespace}"],
            "resourceAttributes": {
                "group": "kueue.x-k8s.io",
                "resource": "workloads",
                "subresource": "status",
                "verb": "patch",
            },
        },
    }
    answer = _kubectl(
        kubectl, kubeconfig, "create", "-o", "json", "-f", "-", stdin=json.dumps(review)
    )
    return bool(json.loads(answer).get("status", {}).get("allowed"))


def identity_kubeconfig(
    kubeconfig: Path, identity: Identity, path: Path, *, kubectl: Path | None = None
) -> Path:
    """A kubeconfig at ``path`` with ``kubeconfig``'s server and CA and a token of the
    account, valid for a day."""
    kubectl = kubectl or find_kubectl()
    token = _service_account_token(kubectl, Path(kubeconfig), identity.namespace, identity.account)
    return _token_kubeconfig(kubectl, Path(kubeconfig), token, path)


_ensured: dict[tuple[str, Identity], Path] = {}


def ensure_identity(kubeconfig: Path, identity: Identity = HARNESS) -> Path:
    """The identity installed on the cluster of the admin ``kubeconfig`` (with every
    component, without the fence policy: that one is every writer's, left to whoever tests
    binds) the first time it is asked for in this process, and its kubeconfig, kept next to
    ``kubeconfig``."""
    kubeconfig = Path(kubeconfig)
    key = (str(kubeconfig.resolve()), identity)
    if key not in _ensured:
        folder = kubeconfig.parent / f"identity-{identity.namespace}"
        install_identity(kubeconfig, identity, workdir=folder, fence=False)
        _ensured[key] = identity_kubeconfig(kubeconfig, identity, folder / "kubeconfig")
    return _ensured[key]
