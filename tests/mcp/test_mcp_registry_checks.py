"""Registry drift fails `manage.py check`: a missing security row, a schema that does not compile, a
gated tool without approval_id, unbounded free text, a read tool claiming a write annotation, duplicates."""

import pytest

from mcp import registry
from mcp.apps import registry_check
from mcp.schema import obj, string


@pytest.fixture
def scratch():
    yield "drifttest"
    registry._catalogues.pop("drifttest", None)


def declare(name, **kw):
    spec = {"name": name, "title": name, "description": "A scratch tool for the drift check test.",
            "securable": "Infrastructure", "operation": "Read", "input_schema": obj(), "catalogue": "drifttest"}
    spec.update(kw)
    registry.tool(**spec)(lambda ctx, args: {})


def ids():
    return sorted({e.id for e in registry_check() if e.obj and str(e.obj).startswith("t_")})


def test_the_real_catalogues_are_clean():
    assert list(registry_check()) == []


def test_each_kind_of_drift_is_an_error(scratch):
    declare("t_nosec", securable="Nonsense")
    declare("t_badschema", input_schema={"type": "object", "properties": {"x": {"type": "nope"}}})
    declare("t_gated", securable="Tag", operation="Delete", effect="destructive")
    declare("t_freetext", input_schema=obj({"q": {"type": "string"}}))
    declare("t_annot", operation="Write", effect="read")
    declare("t_terse", description="short")
    declare("t_unbounded", input_schema=obj({"since": {"type": "integer", "minimum": 0}}))
    assert ids() == ["mcp.E002", "mcp.E003", "mcp.E005", "mcp.E007", "mcp.E008", "mcp.E009", "mcp.E010"]


def test_duplicate_declarations(scratch):
    declare("t_dup")

    def other(ctx, args):
        return {}

    other.__module__ = "somewhere.else"
    registry.tool(name="t_dup", title="t", description="A scratch tool declared a second time.",
                  securable="Infrastructure", operation="Read", input_schema=obj({"a": string(5)}),
                  catalogue="drifttest")(other)
    assert "mcp.E001" in [e.id for e in registry_check()]


def test_manage_check_fails_on_drift(scratch):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    declare("t_gated", securable="Tag", operation="Delete", effect="destructive")
    with pytest.raises(SystemCheckError, match="does not declare approval_id"):
        call_command("check")
