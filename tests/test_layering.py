"""The packages form layers: imports only point down, and no modules import each other
in a circle. Read from the source (every import, also those inside functions), so the rule
holds for lazy imports too; docs/architecture.md ("Layers") describes the same layers."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Bottom to top. A package imports only packages on lower layers (never one on its own
# layer: those are independent of each other).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("common",),
    ("warehouse", "reports"),
    ("joins",),
    ("quality",),
    ("pipeline",),
    ("demo",),
    ("jobs",),
    ("orchestration", "benchmarks"),
    ("dags",),
)
LAYER = {package: level for level, packages in enumerate(LAYERS) for package in packages}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for package in LAYER for path in (ROOT / package).rglob("*.py")}


def imported(path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """The project modules ``path`` imports, with the line of each import."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from joins import ssbj`` imports the module joins.ssbj
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                for a in node.names
            ]
        else:
            continue
        for name in names:
            target = name
            while target and target not in modules:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target:
                yield target, node.lineno


def import_graph() -> dict[str, dict[str, int]]:
    modules = project_modules()
    return {
        module: {target: line for target, line in imported(path, modules) if target != module}
        for module, path in modules.items()
    }


def test_the_layer_table_names_every_package() -> None:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    packages |= {"dags"}  # Airflow's DAG folder: files, not a package
    assert packages - {"tests"} == set(LAYER)


def test_imports_only_point_down() -> None:
    upward = [
        f"{module} (line {line}) imports {target}: layer {LAYER[module.split('.')[0]]} "
        f"-> layer {LAYER[target.split('.')[0]]}"
        for module, targets in import_graph().items()
        for target, line in targets.items()
        if module.split(".")[0] != target.split(".")[0]
        and LAYER[module.split(".")[0]] <= LAYER[target.split(".")[0]]
    ]
    assert not upward, "imports that do not point to a lower layer:\n" + "\n".join(upward)


def test_no_modules_import_each_other_in_a_circle() -> None:
    graph = import_graph()
    circles = strongly_connected(graph)
    assert not circles, "modules that import each other in a circle: " + "; ".join(
        " -> ".join(sorted(c)) for c in circles
    )


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """Tarjan's algorithm: the components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in graph:
        if node not in index:
            visit(node)
    return found
