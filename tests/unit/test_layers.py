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


LOGIC = PACKAGE / "logic"
SOURCES = {"workloads": "gangcheck.logic.workloads", "podgroups": "gangcheck.logic.podgroups"}
EDGES = {
    "workload.py": "gangcheck.reconcile.workload",
    "podgroup.py": "gangcheck.reconcile.podgroup",
}


def _users(paths: list[Path], module: str) -> set[str]:
    return {
        p.relative_to(PACKAGE).as_posix()
        for p in paths
        if any(n == module or n.startswith(module + ".") for n in imported(p))
    }


@pytest.mark.parametrize(
    ("source", "other"), [("workloads", "podgroups"), ("podgroups", "workloads")]
)
def test_the_gang_sources_do_not_import_each_other(source: str, other: str) -> None:
    assert _users(sorted((LOGIC / source).rglob("*.py")), SOURCES[other]) == set()


@pytest.mark.parametrize(
    ("edge", "other"), [("workload.py", "podgroup.py"), ("podgroup.py", "workload.py")]
)
def test_the_gang_sources_edges_do_not_import_each_other(edge: str, other: str) -> None:
    assert _users([PACKAGE / "reconcile" / edge], EDGES[other]) == set()


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_the_attempt_core_and_the_capacity_backends_import_no_gang_source(source: str) -> None:
    core = sorted([*(LOGIC / "attempt").rglob("*.py"), *(LOGIC / "capacity").rglob("*.py")])
    assert _users(core, SOURCES[source]) == set()


def _module_graph(roots: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the project modules it imports when it is imported (module level, outside
    `if TYPE_CHECKING:`); `from pkg import sub` is an edge to the submodule only."""
    files = {}
    for top, folder in roots.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((top, *parts))
            files[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = {f"{node.module}.{a.name}" for a in node.names} & files.keys()
                edges |= subs
                if node.module in files and len(subs) < len(node.names):
                    edges.add(node.module)
            elif isinstance(node, ast.Import):
                edges |= {a.name for a in node.names} & files.keys()
        graph[name] = edges - {name}
    return graph


def _cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    path: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for nxt in sorted(graph[node]):
            if found := visit(nxt):
                return found
        path.pop()
        done.add(node)
        return None

    return visit(start)


def test_no_import_cycles_in_the_product_or_the_dev_tooling() -> None:
    roots = {"gangcheck": PACKAGE, "gangcheck_dev": PACKAGE.parent / "hack/devtools/gangcheck_dev"}
    graph = _module_graph(roots)
    assert len(graph) > 50
    cycles = [c for m in sorted(graph) if (c := _cycle_from(m, graph))]
    assert not cycles, " -> ".join(cycles[0])
