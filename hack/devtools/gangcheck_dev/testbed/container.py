"""The controller's image, built and run here as a kubelet would run its Deployment's pod.

:func:`ensure_image` runs ``hack/image.sh build`` (it installs the docker engine and
debootstrap when missing, starts dockerd when none answers, makes or reuses the cached Debian
base, builds with no network) and returns the image's id. :class:`DockerEngine` takes a
shared lock for as long as a test session uses the daemon, and stops the daemon at the end
only if ``hack/image.sh`` started it and no other session still holds the lock.

:func:`docker_run_argv` turns a Deployment (as rendered by kustomize or Helm) into the
``docker run`` of its controller container: the pod's and container's ``securityContext``
(user, read-only root, capabilities dropped, no privilege escalation), its ``emptyDir``
volumes as tmpfs, its env (``fieldRef`` to the pod's name and namespace), its args with
``$(VAR)`` expanded, and its resource limits. There is no kubelet, so two things differ:
the host's network (ports moved to free ones on 127.0.0.1), and a kubeconfig holding the
ServiceAccount's token mounted in place of ``--in-cluster``.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from gangcheck_dev.testbed.binaries import BuildError, cache_dir, repo_root

__all__ = [
    "KUBECONFIG_IN_CONTAINER",
    "DockerEngine",
    "Image",
    "PodIdentity",
    "docker_run_argv",
    "ensure_image",
    "let_go",
]

#: Where the ServiceAccount's kubeconfig is mounted in the container.
KUBECONFIG_IN_CONTAINER = "/var/run/gangcheck/kubeconfig"
_VAR_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_BINARY_SUFFIXES = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}


@dataclass(frozen=True)
class Image:
    """What ``hack/image.sh build`` reported: the image's id, its tag, and the base's tag; and
    the tag this process holds the image by (`hold`, see `ensure_image`)."""

    id: str
    tag: str
    base: str
    hold: str = ""


_HOLD_PREFIX = "gangcheck:held-"


def _script(*args: str, capture: bool) -> str:
    script = repo_root() / "hack" / "image.sh"
    result = subprocess.run(
        ["bash", str(script), *args],
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise BuildError(
            f"hack/image.sh {' '.join(args)} failed with exit code {result.returncode}"
            " (its output on stderr says why)"
        )
    return result.stdout or ""


def ensure_image() -> Image:
    """Builds the image (cached layers make a rebuild of unchanged sources take seconds); one
    build at a time on this machine. A session that asked while another's build ran (the
    workers of one test run ask together) takes that build's image: it was built from the
    sources both asked with.

    The image is held for this process by a tag of its own (``gangcheck:held-<pid>``) until
    `let_go`: ``hack/image.sh`` removes the image its tag named before a build only when
    nothing else tags it, so another session's build from other sources (another checkout)
    never removes the image a session still runs. Holds of processes that are gone are
    dropped here."""
    directory = cache_dir() / "image"
    directory.mkdir(parents=True, exist_ok=True)
    last = directory / "last-build.txt"
    with (directory / "build.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            waited_since = None
        except BlockingIOError:
            waited_since = time.time()
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if waited_since is not None and last.is_file() and last.stat().st_mtime >= waited_since:
                built = last.read_text()
            else:
                built = _script("build", capture=True)
                last.write_text(built)
            reported = dict(line.split("=", 1) for line in built.splitlines() if "=" in line)
            try:
                image = Image(id=reported["image"], tag=reported["tag"], base=reported["base"])
            except KeyError as missing:
                raise BuildError(f"hack/image.sh build did not report {missing}") from None
            _drop_stale_holds()
            hold = f"{_HOLD_PREFIX}{os.getpid()}"
            _docker("tag", image.id, hold)
            return Image(id=image.id, tag=image.tag, base=image.base, hold=hold)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def let_go(image: Image) -> None:
    """Ends this process's hold of the image: its tag goes (and the image with it when no
    other tag names it and no container uses it: a build since moved the tag on)."""
    if image.hold:
        subprocess.run(["docker", "image", "rm", image.hold], capture_output=True, check=False)


def _drop_stale_holds() -> None:
    listed = subprocess.run(
        ["docker", "images", "gangcheck", "--format", "{{.Repository}}:{{.Tag}}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    for tag in listed.stdout.split():
        pid = tag.removeprefix(_HOLD_PREFIX)
        if tag.startswith(_HOLD_PREFIX) and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            subprocess.run(["docker", "image", "rm", tag], capture_output=True, check=False)


def _docker(*args: str) -> None:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BuildError(f"docker {' '.join(args)} failed: {result.stderr.strip()}")


class DockerEngine:
    """A test session's use of the docker daemon: shared while held, stopped by the last one.

    ``hack/image.sh`` starts dockerd only when none answers, and records its pid; sessions
    hold a shared ``flock`` while they use it, and the session that releases it last (an
    exclusive lock is then free) stops a daemon the script started. One started otherwise
    (a system service, a person's) is never stopped.
    """

    def __init__(self) -> None:
        self._lock: TextIO | None = None

    def acquire(self) -> None:
        directory = cache_dir() / "image"
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = (directory / "users.lock").open("a")
        fcntl.flock(self._lock, fcntl.LOCK_SH)

    def release(self) -> None:
        """Stops the daemon if we started it and no other session uses it."""
        if self._lock is None:
            return
        lock, self._lock = self._lock, None
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another session still uses the daemon
            _script("stop", capture=False)
        finally:
            lock.close()


@dataclass(frozen=True)
class PodIdentity:
    """What the downward API would tell the container about its pod."""

    name: str
    namespace: str


#: The names of gangcheck's containers: the controller's Deployment, the dispatcher's.
_GANGCHECK_CONTAINERS = ("controller", "dispatcher")


def _controller_container(deployment: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod spec, and its one container that runs gangcheck (the controller's or the
    dispatcher's)."""
    pod = deployment["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] in _GANGCHECK_CONTAINERS]
    return dict(pod), dict(container)


def _env(container: Mapping[str, Any], pod: PodIdentity) -> dict[str, str]:
    fields = {"metadata.name": pod.name, "metadata.namespace": pod.namespace}
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = str(var["value"])
            continue
        path = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if path not in fields:
            raise ValueError(f"env {var['name']}: only {sorted(fields)} are supported here")
        env[var["name"]] = fields[path]
    return env


def _expand(arg: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` as the kubelet expands it (an unknown reference stays as written)."""
    return _VAR_REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), arg)


def _bytes(quantity: str) -> int:
    for suffix, factor in _BINARY_SUFFIXES.items():
        if quantity.endswith(suffix):
            return int(quantity.removesuffix(suffix)) * factor
    return int(quantity)


def _cpus(quantity: str) -> str:
    return str(int(quantity.removesuffix("m")) / 1000) if quantity.endswith("m") else quantity


def _security(pod: Mapping[str, Any], container: Mapping[str, Any]) -> list[str]:
    pod_ctx = pod.get("securityContext") or {}
    ctx = {**pod_ctx, **(container.get("securityContext") or {})}
    user, group = ctx.get("runAsUser"), ctx.get("runAsGroup")
    if ctx.get("runAsNonRoot") and (user is None or int(user) == 0):
        raise ValueError("runAsNonRoot without a non-zero runAsUser: the kubelet would refuse")
    argv = [f"--user={user}:{group if group is not None else user}"] if user is not None else []
    if ctx.get("readOnlyRootFilesystem"):
        argv.append("--read-only")
    argv += [f"--cap-drop={cap}" for cap in (ctx.get("capabilities") or {}).get("drop") or []]
    argv += [f"--cap-add={cap}" for cap in (ctx.get("capabilities") or {}).get("add") or []]
    if ctx.get("allowPrivilegeEscalation") is False:
        argv.append("--security-opt=no-new-privileges")
    if (ctx.get("seccompProfile") or {}).get("type") not in (None, "RuntimeDefault"):
        raise ValueError("only the RuntimeDefault seccomp profile is supported here")
    return argv


def _volumes(pod: Mapping[str, Any], container: Mapping[str, Any], empty_dir: Path) -> list[str]:
    """emptyDir as tmpfs; an optional Secret that is not there as an empty read-only folder."""
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    argv: list[str] = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes[mount["name"]]
        target = mount["mountPath"]
        if "emptyDir" in volume:
            limit = (volume["emptyDir"] or {}).get("sizeLimit")
            size = f",size={_bytes(limit)}" if limit else ""
            argv.append(f"--tmpfs={target}:rw,nosuid,nodev,mode=1777{size}")
        elif (volume.get("secret") or {}).get("optional"):
            empty_dir.mkdir(parents=True, exist_ok=True)
            argv.append(f"--volume={empty_dir}:{target}:ro")
        else:
            raise ValueError(f"volume {mount['name']}: only emptyDir and optional Secrets here")
    return argv


def _limits(container: Mapping[str, Any]) -> list[str]:
    limits = (container.get("resources") or {}).get("limits") or {}
    argv = [f"--memory={_bytes(str(limits['memory']))}"] if "memory" in limits else []
    return argv + ([f"--cpus={_cpus(str(limits['cpu']))}"] if "cpu" in limits else [])


def docker_run_argv(
    deployment: Mapping[str, Any],
    *,
    image: str,
    container_name: str,
    pod: PodIdentity,
    kubeconfig: Path,
    workdir: Path,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """``docker run`` of the Deployment's ``controller`` container (see the module's doc).

    ``extra_args`` follow the Deployment's args (the later of two flags wins): the tests
    move the ports to free ones with them.
    """
    pod_spec, container = _controller_container(deployment)
    env = _env(container, pod)
    args = [_expand(arg, env) for arg in container.get("args") or []]
    args = [f"--kubeconfig={KUBECONFIG_IN_CONTAINER}" if a == "--in-cluster" else a for a in args]
    return [
        "docker",
        "run",
        "--rm",
        f"--name={container_name}",
        f"--hostname={pod.name}",
        "--network=host",
        "--pull=never",
        *_security(pod_spec, container),
        *_limits(container),
        *_volumes(pod_spec, container, workdir / f"{container_name}-empty"),
        f"--volume={kubeconfig}:{KUBECONFIG_IN_CONTAINER}:ro",
        *(f"--env={name}={value}" for name, value in env.items()),
        image,
        *args,
        *extra_args,
    ]


def readable_by(path: Path, user: int) -> None:
    """Lets the container's user read a file we wrote (owner when we may chown, else all)."""
    if os.geteuid() == 0:
        os.chown(path, user, user)
    else:
        path.chmod(0o644)


def remove_container(name: str) -> None:
    """``docker rm -f``: the container is gone even if its ``docker run`` client was killed."""
    subprocess.run(
        ["docker", "rm", "--force", name],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
