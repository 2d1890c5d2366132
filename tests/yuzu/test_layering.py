"""The layers stay apart: mcp/ is MCP machinery only and imports nothing from the apps that plug into it
(fleet, approvals, bridge) — they reach it through hooks (the approval gate, object permissions, plans).
And no module of the project imports itself back through a chain of imports (an import cycle)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS = ("fleet", "approvals", "bridge", "pki")


def imported_modules(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get_model" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield first.value  # apps.get_model("fleet", …) is an import by another name


def test_mcp_imports_no_app():
    offending = sorted({f"{path.relative_to(ROOT)}: {name}" for path in (ROOT / "mcp").rglob("*.py")
                        for name in imported_modules(path) if name.split(".")[0] in APPS})
    assert offending == []


# --- the whole project: no import cycle ----------------------------------------------------------------

PROJECT = ("yuzu", "mcp", "fleet", "approvals", "bridge", "oauth", "pki")
NO_LOCAL_IMPORTS = ("fleet", "bridge")  # these apps import everything at module top
WHY = re.compile(r"#\s*(cycle|deferred):\s*\S")  # the comment a function-local import must carry


def project_modules():
    """{dotted module name: path} of every module of the project's packages."""
    found = {}
    for app in PROJECT:
        for path in sorted((ROOT / app).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)] = path
    return found


MODULES = project_modules()


def _target(name, path, node, alias):
    """The project module an import names (the longest known prefix of it), or None."""
    if isinstance(node, ast.Import):
        target = alias.name
    else:
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join(anchor + ([base] if base else []))
        target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base  # `from . import x`
    while target not in MODULES and "." in target:
        target = target.rpartition(".")[0]
    return target if target in MODULES else None


def _type_checking_only(node):
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): a block that never runs, only mypy reads it."""
    test = getattr(node, "test", None) if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_statements(path, runtime_only=False):
    """Every import statement of a module, with whether it runs inside a function (or lambda) rather
    than when the module is imported. ``runtime_only`` leaves out the imports only type checkers see."""
    found = []

    def walk(node, local):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, local))
            if runtime_only and _type_checking_only(child):
                continue
            walk(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(ast.parse(path.read_text(), filename=str(path)), False)
    return found


def import_graph():
    """Module → the project modules it imports when it is imported (function-local imports and those under
    ``if TYPE_CHECKING:``, which never run, do not count)."""
    graph = {}
    for name, path in MODULES.items():
        targets = {_target(name, path, node, alias) for node, local in import_statements(path, runtime_only=True)
                   if not local
                   for alias in node.names}
        graph[name] = targets - {None, name}
    return graph


def find_cycles(graph):
    """One cycle (a list of modules, the first repeated at the end) per strongly connected component
    that has any, so each tangle is reported once."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def component(v):  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                component(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.add(w)
                if w == v:
                    break
            if len(members) > 1:
                cycles.append(_cycle_through(graph, min(members), members))

    for v in sorted(graph):
        if v not in index:
            component(v)
    return cycles


def _cycle_through(graph, start, members):
    """A shortest path from ``start`` back to itself inside one strongly connected component."""
    paths, todo = {start: [start]}, [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    raise AssertionError("not a strongly connected component")


def reaches(graph, source, target):
    seen, todo = set(), [source]
    while todo:
        v = todo.pop()
        if v == target:
            return True
        if v not in seen:
            seen.add(v)
            todo.extend(graph[v])
    return False


def test_the_cycle_finder_finds_cycles():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_project():
    """No module of yuzu, mcp, fleet, approvals, bridge or oauth imports, at module top, a module that
    (through any chain of module-top imports) imports it back."""
    graph = import_graph()
    assert {"fleet.consumers", "fleet.models", "mcp.pipeline", "approvals.gate", "bridge.turns", "oauth.models",
            "yuzu.rbac"} <= set(graph)
    assert "fleet.models" in graph["fleet.identity"] and "yuzu.models" in graph["fleet.models"]  # both spellings seen
    cycles = find_cycles(graph)
    assert cycles == [], "import cycles:\n" + "\n".join(" → ".join(c) for c in cycles)


def test_function_local_imports_say_why():
    """An import inside a function hides a dependency from the cycle check above, so each one says why it is
    there, on its line or just above its block of imports: ``# cycle: …`` (the import cycle it breaks —
    checked: the module it imports does import this one back) or ``# deferred: …`` (why it cannot run
    when the module is imported: apps.py runs before any model can be imported; importing Twisted's
    reactor installs one). fleet and bridge have none at all."""
    graph = import_graph()
    offending = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        for node, local in import_statements(path):
            if not local:
                continue
            where = f"{name}:{node.lineno}: {lines[node.lineno - 1].strip()}"
            if name.split(".")[0] in NO_LOCAL_IMPORTS:
                offending.append(f"{where}  (this app imports at module top only)")
                continue
            above = node.lineno - 2
            while above >= 0 and (not lines[above].strip() or lines[above].lstrip().startswith(("import ", "from "))):
                above -= 1
            why = WHY.search(lines[node.lineno - 1]) or (WHY.match(lines[above].strip()) if above >= 0 else None)
            if why is None:
                offending.append(f"{where}  (say why: '# cycle: …' or '# deferred: …')")
            elif why.group(1) == "cycle":
                targets = {_target(name, path, node, alias) for alias in node.names} - {None}
                if not any(reaches(graph, t, name) for t in targets):
                    offending.append(f"{where}  (says cycle, but at module top it would make none: move it up)")
    assert offending == [], "\n".join(offending)
