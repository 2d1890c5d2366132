"""The official MCP Python client, run from its own environment (.venv-mcp; docs/development.md)."""

import os

from yuzu.testing import ROOT

MCP_PY = ROOT / ".venv-mcp" / "bin" / "python"


DRIVE = ROOT / "tests" / "mcp_client" / "drive.py"


def client_env():
    """The SDK's interpreter must see none of the project: no PYTHONPATH, no Django settings."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("ANTHROPIC_", "DJANGO_", "PYTHON")) and k not in ("VIRTUAL_ENV",)}
