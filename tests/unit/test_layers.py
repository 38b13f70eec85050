"""The layering contract: gangcheck/logic/ (and model/) import no I/O library."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "gangcheck"
IO_LIBRARIES = {"kubernetes_asyncio", "aiohttp", "tenacity", "opentelemetry", "socket",
                "subprocess", "urllib", "http", "ssl", "asyncio"}  # fmt: skip
PURE = sorted([*(PACKAGE / "logic").rglob("*.py"), *(PACKAGE / "model").glob("*.py")])
IO_MODULES = tuple(
    f"gangcheck.{m}"
    for m in ("kube", "reconcile", "reclaim", "runtime", "app", "server", "telemetry")
)


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", PURE, ids=[f"{p.parent.name}/{p.name} is pure" for p in PURE])
def test_pure_modules_import_no_io(path: Path) -> None:
    names = imported(path)
    assert not {n for n in names if n.split(".")[0] in IO_LIBRARIES}
    assert not {n for n in names if n.startswith(IO_MODULES)}


def test_only_the_kube_layer_and_config_loading_import_the_client_library() -> None:
    users = {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if any(n.startswith("kubernetes_asyncio") for n in imported(p))
    }
    assert users == {"kube/client.py"}


def test_the_product_never_imports_the_dev_tooling() -> None:
    users = {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if any(n.split(".")[0] == "gangcheck_dev" for n in imported(p))
    }
    assert users == set()


def test_the_dev_tooling_is_not_in_the_product_distribution() -> None:
    assert not (PACKAGE / "testbed").exists()
    assert not (PACKAGE / "simcloud").exists()
    assert not (PACKAGE / "demo.py").exists()
