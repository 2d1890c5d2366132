"""RBAC decisions: global grants, group grants (with the group hierarchy), and the tier ceiling."""

import pytest

from fleet.models import Agent, ManagementGroup
from yuzu import rbac
from yuzu.errors import PermissionDenied
from yuzu.policy import requires_approval, tier_allows, tier_floor

pytestmark = pytest.mark.django_db


def test_global_roles(principal):
    viewer, operator, admin = principal("v", "Viewer"), principal("o", "Operator"), principal("a", "Administrator")
    assert rbac.may(viewer, "Infrastructure", "Read") and not rbac.may(viewer, "Execution", "Execute")
    assert rbac.may(operator, "Execution", "Execute") and not rbac.may(operator, "UserManagement", "Write")
    assert rbac.may(admin, "UserManagement", "Write") and rbac.may(admin, "Security", "Execute")


def test_group_grant_covers_members_and_child_groups(principal):
    parent = ManagementGroup.objects.create(name="web")
    child = ManagementGroup.objects.create(name="web-eu", parent=parent)
    inside, nested, outside = (Agent.objects.create(agent_id=i) for i in ("in", "nested", "out"))
    parent.members.add(inside)
    child.members.add(nested)
    owner = principal("owner", "ITServiceOwner", group=parent)
    assert rbac.may(owner, "Execution", "Execute", agent=inside)
    assert rbac.may(owner, "Execution", "Execute", agent=nested)
    assert not rbac.may(owner, "Execution", "Execute", agent=outside)
    assert not rbac.may(owner, "Execution", "Execute")  # no fleet-wide grant
    assert rbac.has_any(owner, "Execution", "Execute")
    assert rbac.may(owner, "ManagementGroup", "Write", group=child)
    assert not rbac.may(owner, "ManagementGroup", "Write", group=ManagementGroup.objects.create(name="db"))


def test_dynamic_group_grant(principal):
    g = ManagementGroup.objects.create(name="linux", membership_type="dynamic", scope_expression="ostype == linux")
    lin, win = Agent.objects.create(agent_id="l", os="linux"), Agent.objects.create(agent_id="w", os="windows")
    owner = principal("owner", "ITServiceOwner", group=g)
    assert rbac.may(owner, "Execution", "Execute", agent=lin)
    assert not rbac.may(owner, "Execution", "Execute", agent=win)


def test_no_role_means_nothing(principal):
    nobody = principal("nobody", None)
    assert not rbac.may(nobody, "Infrastructure", "Read") and not rbac.has_any(nobody, "Infrastructure", "Read")


@pytest.mark.parametrize("tier,sec,op,allowed,gated", [
    ("", "Security", "Write", True, False),
    ("readonly", "Infrastructure", "Read", True, False),
    ("readonly", "Tag", "Write", False, False),
    ("operator", "Tag", "Write", True, False),
    ("operator", "Tag", "Delete", True, True),
    ("operator", "Execution", "Execute", True, False),
    ("operator", "ApiToken", "Rotate", True, False),
    ("operator", "ManagementGroup", "Write", False, False),
    ("supervised", "Execution", "Execute", True, True),
    ("supervised", "ApiToken", "Rotate", True, False),
    ("supervised", "ApiToken", "Write", True, True),
    ("supervised", "Tag", "Write", True, False),
    ("supervised", "Tag", "Delete", True, True),
    ("supervised", "UserManagement", "Write", True, True),
    ("bogus", "Infrastructure", "Read", False, False),
])
def test_tier_policy(tier, sec, op, allowed, gated):
    assert tier_allows(tier, sec, op) is allowed
    assert requires_approval(tier, sec, op) is gated


def test_tier_floor():
    assert tier_floor("Infrastructure", "Read") == "readonly"
    assert tier_floor("Tag", "Delete") == "operator"
    assert tier_floor("Security", "Write") == "supervised"


def test_tier_is_a_ceiling_over_rbac(principal):
    admin_ro = principal("a", "Administrator", tier="readonly")
    with pytest.raises(PermissionDenied) as e:
        rbac.check(admin_ro, "Tag", "Write")
    assert e.value.permission == "Tag:Write"
    viewer_sup = principal("v", "Viewer", tier="supervised")
    with pytest.raises(PermissionDenied):
        rbac.check(viewer_sup, "Tag", "Write")  # the tier allows; RBAC does not
    admin_sup = principal("s", "Administrator", tier="supervised")
    with pytest.raises(PermissionDenied):  # REST may not bypass an approval-gated op for an MCP token
        rbac.check(admin_sup, "Execution", "Execute")
    rbac.check(admin_sup, "Execution", "Execute", surface="mcp")
    rbac.check(principal("plain", "Administrator"), "Execution", "Execute")
