"""The bridge's modules form layers: no import cycle among them, and every import at module top (an import
inside a function would hide a cycle rather than break it)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BRIDGE = ROOT / "bridge"


def modules():
    for path in sorted(BRIDGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        yield (".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)), path


def bridge_imports(name, path):
    """The bridge modules one module imports (wherever the import statement is)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from . import x` imports the module bridge.x when there is one
            targets = [f"{base}.{a.name}" if (ROOT / Path(*f"{base}.{a.name}".split("."))).with_suffix(".py").exists()
                       else base for a in node.names]
        yield from (t for t in targets if t == "bridge" or t.startswith("bridge."))


def graph():
    names = dict(modules())
    return {name: {t for t in bridge_imports(name, path) if t in names and t != name}
            for name, path in names.items()}


def test_no_import_cycle_in_bridge():
    g = graph()
    assert {"bridge.models", "bridge.turns", "bridge.workers", "bridge.identity"} <= set(g)
    assert "bridge.models" in g["bridge.turns"]  # the parse sees relative imports
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(g[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_no_function_local_imports_in_bridge():
    offending = []
    for name, path in modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        for f in ast.walk(tree):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                offending += [f"{name}:{n.lineno}" for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert offending == []


def test_the_code_map_in_the_docs_is_the_import_order():
    """docs/bridge.md's code map lists the modules so that each imports only modules above it."""
    text = (ROOT / "docs" / "bridge.md").read_text()
    section = text[text.index("## Code map"):]
    section = section[:section.index("\n## ", 1)]
    order = [line.split()[0][:-3].replace("/", ".") for line in section.splitlines()
             if line.startswith("    bridge/")]
    g = graph()
    assert set(order) <= set(g) and len(order) >= 12
    late = [f"{m} imports {dep}" for i, m in enumerate(order) for dep in sorted(g[m])
            if dep in order and order.index(dep) > i]
    assert late == []
