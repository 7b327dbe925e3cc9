"""The house's layering (docs/development.md, Layout): binomial_stats < env < engines < jetson < eval < benchmarks.
No module imports a higher layer, and no modules import each other in a circle, counting the imports inside functions
(made lazily for speed, they still tie the modules together). The assembly reasoning probe (assembly_probe) is a
product of its own beside the benchmark's chain: it imports only the layers in PROBE_IMPORTS (the statistics both
share, the task's geometry), and nothing outside it imports it."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("binomial_stats", "env", "engines", "jetson", "eval", "benchmarks")
PROBE = "assembly_probe"
PROBE_IMPORTS = ("binomial_stats", "env")  # what the probe may import of the house


def _modules() -> dict[str, Path]:
    out = {}
    for top in LAYERS + (PROBE,):
        for path in (REPO / top).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports, anywhere in its code (``from pkg import mod`` counts as mod)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:  # a name inside a module: the module
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


def _layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def _top(module: str) -> str:
    return module.split(".")[0]


def test_no_module_imports_a_higher_layer():
    graph = {m: ts for m, ts in _graph().items() if _top(m) != PROBE}
    wrong = sorted(f"{m} imports {t}" for m, ts in graph.items() for t in ts if _top(t) != PROBE
                   and _layer(t) > _layer(m))
    assert not wrong, wrong


def test_the_probe_stands_beside_the_benchmark():
    """assembly_probe imports only binomial_stats and env of the house; no module outside it imports it (eval/ is
    the benchmark's evaluation alone)."""
    graph = _graph()
    assert any(_top(m) == PROBE for m in graph)  # the rule has something to check
    out = sorted(f"{m} imports {t}" for m, ts in graph.items() if _top(m) == PROBE for t in ts
                 if _top(t) != PROBE and _top(t) not in PROBE_IMPORTS)
    into = sorted(f"{m} imports {t}" for m, ts in graph.items() if _top(m) != PROBE for t in ts if _top(t) == PROBE)
    assert not out and not into, out + into


def test_no_import_circle():
    graph = _graph()
    # a package's __init__ importing its own modules is no circle of the house; only modules of other files count
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    import sys

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, circles
