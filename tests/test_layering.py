"""The layers stay apart: mcp/ is MCP machinery only and imports nothing from the apps that plug into it
(fleet, approvals, bridge) — they reach it through hooks (the approval gate, object permissions, plans)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("fleet", "approvals", "bridge")


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
