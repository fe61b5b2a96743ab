"""The house's layout holds: no import cycle, no private name imported across modules, short modules, and
arrows that point down only (edges -> reports, search, validation -> core -> spec).

Every import counts, those inside functions too: a lazy import hides a cycle from Python, not from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "meshplan"
MAX_LINES = 500
MAX_TOP_MODULES = 6
LAYERS = {  # a package and the packages it may never import
    "spec": ("configs", "core", "search", "reports", "validation", "cli", "server", "exports", "check"),
    "configs": ("core", "search", "reports", "validation", "cli", "server", "exports", "check"),
    "core": ("configs", "search", "reports", "validation", "cli", "server", "exports", "check"),
    "search": ("configs", "reports", "validation", "cli", "server", "exports", "check"),
    "reports": ("validation", "cli", "server"),
    "validation": ("cli", "server", "exports", "check"),
    "exports": ("cli", "server", "check"),
    "traces": ("spec", "core", "search", "reports", "validation", "cli", "server", "exports", "check"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _target(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = here.split(".") if is_package else here.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports(name: str, path: Path) -> list[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for every import in the module, nested ones too."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.startswith("meshplan")]
        elif isinstance(node, ast.ImportFrom):
            module = _target(node, name, path.name == "__init__.py")
            if not module.startswith("meshplan"):
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.append((sub, None) if sub in MODULES else (module, alias.name))
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _edges(name: str) -> set[str]:
    """The meshplan modules ``name`` imports (a package's own submodules count, its parents do not)."""
    out = set()
    for module, _ in GRAPH[name]:
        while module and module not in MODULES:
            module = module.rpartition(".")[0]
        if module and module != name and not name.startswith(module + "."):
            out.add(module)
    return out


def test_no_import_cycle() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in _edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    assert cycles == []


def test_no_private_name_is_imported_across_modules() -> None:
    taken = [
        f"{name} takes {module}.{what}"
        for name, imports in GRAPH.items()
        for module, what in imports
        if what is not None and what.startswith("_") and not what.startswith("__") and module != name
    ]
    assert taken == []


def test_no_module_is_over_500_lines() -> None:
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_top_of_the_package_holds_few_modules() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


def test_arrows_point_down() -> None:
    up = []
    for name in MODULES:
        parts = name.split(".")
        if len(parts) < 2 or parts[1] not in LAYERS:
            continue
        for target in _edges(name):
            tparts = target.split(".")
            if len(tparts) > 1 and tparts[1] in LAYERS[parts[1]]:
                up.append(f"{name} -> {target}")
    assert up == []


def test_the_walker_sees_what_it_must() -> None:
    """The checks above read real imports: the CLI's entry imports its parser, the planner imports the core."""
    assert "meshplan.cli.parser" in _edges("meshplan.cli")
    assert any(t.startswith("meshplan.core") for t in _edges("meshplan.search.rank"))
    assert len(MODULES) > 100
    assert "meshplan.traces.kineto" in _edges("meshplan.reports.compare")
