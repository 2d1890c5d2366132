"""The superuser's access pages keep the rules the services keep: a role assignment is checked by the rules every
grant keeps (RoleAssignment.clean, which the group-role service runs too); an account is locked and unlocked by the
accounts service (row lock, its audit rows); a device token is shown and revoked, not edited; the bridge's records
are shown, not edited, and a delete leaves an audit row."""

import html
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import ManagementGroup
from tests.support.browser import staff_client
from yuzu import rbac
from yuzu.errors import PermissionDenied
from yuzu.models import AuditEvent, Role, RoleAssignment

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(make_user):
    return staff_client(make_user, "root", superuser=True)


def page_text(r):
    return html.unescape(r.content.decode())


def test_the_administrator_role_is_not_granted_on_a_group_on_the_page_either(root, make_user):
    """The group-role service refused Administrator on a group; the admin's role-assignment page granted it."""
    from fleet import services

    mallory = make_user("mallory")
    web = ManagementGroup.objects.create(name="web")
    admin_role = Role.objects.get(name="Administrator")
    r = root.post("/admin/yuzu/roleassignment/add/", {"user": mallory.pk, "role": admin_role.pk, "group": web.pk})
    assert r.status_code == 200 and "the Administrator role is granted globally, not on a group" in page_text(r)
    viewer = RoleAssignment.objects.create(user=mallory, role=Role.objects.get(name="Viewer"), group=web)
    r = root.post(f"/admin/yuzu/roleassignment/{viewer.pk}/change/",
                  {"user": mallory.pk, "role": admin_role.pk, "group": web.pk})
    assert r.status_code == 200 and "the Administrator role is granted globally, not on a group" in page_text(r)
    assert list(RoleAssignment.objects.filter(user=mallory).values_list("role__name", "group")) == [("Viewer", web.pk)]
    assert not AuditEvent.objects.filter(action__startswith="admin.roleassignment").exists()
    # the service keeps the same rule (REST and MCP)
    principal = rbac.Principal(user=root.device.user, via="session", mfa_verified_at=time.time())
    with pytest.raises(PermissionDenied, match="granted globally, not on a group"):
        services.plan_assign_group_role(principal, web.pk, "mallory", "Administrator")
    # globally it is granted, and on a group any other role is
    r = root.post("/admin/yuzu/roleassignment/add/", {"user": mallory.pk, "role": admin_role.pk, "group": ""})
    assert r.status_code == 302
    assert RoleAssignment.objects.filter(user=mallory, role=admin_role, group=None).exists()
