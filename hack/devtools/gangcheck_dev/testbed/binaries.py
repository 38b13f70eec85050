"""The Go binaries of the test bed, built from the pinned wrapper modules by ``hack/build.sh``.

On a machine with a warm cache this returns at once; on a cold one it builds (tens of minutes),
streaming the build's progress to stderr. That is intended: the test bed never skips.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

CONTROL_PLANE = ("etcd", "kubernetes")
#: Karpenter with its kwok cloud provider: the stack's other autoscaler (instead of
#: cluster-autoscaler, never beside it).
KARPENTER = ("karpenter",)
#: The families of the full local stack, with either autoscaler.
ALL_FAMILIES = (*CONTROL_PLANE, "kwok", "kueue", "autoscaler", *KARPENTER)
#: The OpenTelemetry Collector the tracing tests send spans to (not part of the stack).
OTEL_COLLECTOR = ("otelcol",)


class BuildError(RuntimeError):
    """``hack/build.sh`` failed or did not report a component."""


def repo_root() -> Path:
    """The checkout this package lives in (the test bed needs its ``hack/`` folder)."""
    root = Path(__file__).resolve().parents[4]
    if not (root / "hack" / "build.sh").is_file():
        raise BuildError(f"{root} has no hack/build.sh: the test bed runs from a source checkout")
    return root


def cache_dir() -> Path:
    """Same rule as ``hack/build.sh``: ``$GANGCHECK_CACHE`` or ``$XDG_CACHE_HOME/gangcheck``."""
    explicit = os.environ.get("GANGCHECK_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "gangcheck"


@contextmanager
def _build_lock() -> Iterator[None]:
    """Serialises builds of concurrent callers (two pytest sessions, a test and a person)."""
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "build.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _parse(stdout: str, components: Sequence[str]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for line in stdout.splitlines():
        name, sep, directory = line.partition("=")
        if sep and name in components:
            found[name] = Path(directory)
    missing = [name for name in components if name not in found or not found[name].is_dir()]
    if missing:
        raise BuildError(f"hack/build.sh did not report a folder for {', '.join(missing)}")
    return found


def ensure_binaries(components: Sequence[str] = CONTROL_PLANE) -> dict[str, Path]:
    """Builds what is missing and returns the folder of each component's binaries."""
    script = repo_root() / "hack" / "build.sh"
    with _build_lock():
        result = subprocess.run(
            ["bash", str(script), *components],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            check=False,
        )
    if result.returncode != 0:
        raise BuildError(
            f"hack/build.sh {' '.join(components)} failed with exit code {result.returncode}"
            " (its output on stderr says why)"
        )
    return _parse(result.stdout, components)
