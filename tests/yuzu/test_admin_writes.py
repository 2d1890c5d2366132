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


def lockout_form(until=None):
    return {"locked_until_0": f"{until:%Y-%m-%d}", "locked_until_1": f"{until:%H:%M:%S}"} if until else \
        {"locked_until_0": "", "locked_until_1": ""}


def test_the_lockout_page_locks_and_unlocks_through_the_accounts_service(root, make_user):
    """The page saved the whole row: the failed-sign-in count it had shown went back over the ones counted since
    (record_failure counts under a row lock), and its audit row was admin.accountlockout.*, not the service's."""
    from yuzu.accounts import record_failure
    from yuzu.models import AccountLockout

    alice = make_user("alice")
    until = timezone.now() + timedelta(days=3)
    r = root.post("/admin/yuzu/accountlockout/add/", {"user": alice.pk, **lockout_form(until)})
    assert r.status_code == 302, page_text(r)
    lock = AccountLockout.objects.get(user=alice)
    assert lock.manual and lock.is_locked()
    row = AuditEvent.objects.get(action="account.lock")
    assert (row.principal, row.target_type, row.target_id) == ("root", "User", "alice")
    assert row.detail.startswith(f"until={until:%Y-%m-%dT%H:%M}")
    page = root.get(f"/admin/yuzu/accountlockout/{lock.pk}/change/")  # the page shows the count …
    assert page.status_code == 200 and 'name="failed_attempts"' not in page.content.decode()
    record_failure("alice")  # … and a failed sign-in is counted meanwhile
    r = root.post(f"/admin/yuzu/accountlockout/{lock.pk}/change/", {"failed_attempts": 0, **lockout_form()})
    assert r.status_code == 302, page_text(r)
    lock.refresh_from_db()
    assert not lock.is_locked() and not lock.manual and lock.failed_attempts == 0
    row = AuditEvent.objects.get(action="account.unlock")  # the row REST and MCP's unlock_account write
    assert (row.principal, row.target_type, row.target_id, row.detail) == ("root", "User", "alice", "was_locked=True")
    assert not AuditEvent.objects.filter(action__startswith="admin.accountlockout").exists()


def test_a_lock_in_the_past_is_refused_and_the_list_unlocks_through_the_service(root, make_user):
    from yuzu.accounts import record_failure
    from yuzu.models import AccountLockout

    bob = make_user("bob")
    for _ in range(5):
        record_failure("bob")
    lock = AccountLockout.objects.get(user=bob)
    assert lock.is_locked() and not lock.manual
    r = root.post(f"/admin/yuzu/accountlockout/{lock.pk}/change/",
                  lockout_form(timezone.now() - timedelta(hours=1)))
    assert r.status_code == 200 and "a lock ends in the future" in page_text(r)
    r = root.post(f"/admin/yuzu/accountlockout/{lock.pk}/change/",
                  lockout_form(timezone.localtime(lock.locked_until)))  # the page as shown, unchanged
    assert r.status_code == 302
    lock.refresh_from_db()
    assert not lock.manual and lock.failed_attempts == 5  # nothing asked, nothing written
    assert not AuditEvent.objects.filter(action__in=("account.lock", "account.unlock")).exists()
    r = root.post("/admin/yuzu/accountlockout/", {"action": "unlock", "_selected_action": [lock.pk]})
    assert r.status_code == 302
    lock.refresh_from_db()
    assert not lock.is_locked() and lock.failed_attempts == 0
    assert AuditEvent.objects.get(action="account.unlock").detail == "was_locked=True"


def test_a_device_token_is_shown_and_revoked_not_edited(root, make_user):
    """The device-token page edited a token's expiry and max uses with no service and no rule: a leaked enrolment
    token's life was extended, or its uses raised, with an audit row that said only which fields. Revoking is a
    change: a staff user who may only view the tokens is not offered it, and a posted one revokes nothing."""
    from django.contrib.auth.models import Permission

    from fleet.management.commands.mint_device_token import mint_device_token
    from fleet.models import DeviceToken

    mint_device_token("lab", expires_days=1, max_uses=1)
    token = DeviceToken.objects.get()
    viewer = staff_client(make_user, "viewer")
    viewer.device.user.user_permissions.add(Permission.objects.get(codename="view_devicetoken"))
    listing = viewer.get("/admin/fleet/devicetoken/")
    assert listing.status_code == 200 and 'value="revoke"' not in listing.content.decode()
    viewer.post("/admin/fleet/devicetoken/", {"action": "revoke", "_selected_action": [token.pk]})
    token.refresh_from_db()
    assert token.revoked_at is None and not AuditEvent.objects.filter(action="device_token.revoke").exists()
    url = f"/admin/fleet/devicetoken/{token.pk}/change/"
    page = root.get(url)
    assert page.status_code == 200 and token.token_hash not in page.content.decode()
    later = timezone.now() + timedelta(days=365)
    r = root.post(url, {"name": "lab", "max_uses": 1000, "expires_at_0": f"{later:%Y-%m-%d}",
                        "expires_at_1": f"{later:%H:%M:%S}"})
    assert r.status_code == 403
    assert root.post(f"/admin/fleet/devicetoken/{token.pk}/delete/", {"post": "yes"}).status_code == 403
    token.refresh_from_db()
    assert (token.max_uses, token.expires_at < timezone.now() + timedelta(days=2)) == (1, True)
    r = root.post("/admin/fleet/devicetoken/", {"action": "revoke", "_selected_action": [token.pk]})
    assert r.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    row = AuditEvent.objects.get(action="device_token.revoke")
    assert (row.principal, row.target_id, row.detail) == ("root", token.pk, "name=lab uses=0")
    root.post("/admin/fleet/devicetoken/", {"action": "revoke", "_selected_action": [token.pk]})  # again: no change
    assert AuditEvent.objects.filter(action="device_token.revoke").count() == 1
    assert DeviceToken.objects.filter(pk=token.pk).exists()


def test_the_bridges_records_are_shown_not_edited_and_a_delete_is_audited(root, make_user):
    """The bridge's record pages deleted a worker, its turns and messages with nothing in yuzu's audit log. They
    keep the delete (deleting a user deletes the workers it spawned, and the admin refuses that to whoever may not
    delete them) but as the fleet's records do: audited, and nothing added or edited."""
    from bridge.models import Member, Message, Turn

    alice = make_user("alice")
    member = Member.objects.create(name="w", profile_name="standin", socket_name="s", owner=alice, owner_key="k")
    turn = Turn.objects.create(member=member, owner_key="k")
    message = Message.objects.create(member=member, turn=turn, content="hello")
    for page in ("member", "turn", "message", "inboxitem"):
        assert root.get(f"/admin/bridge/{page}/add/").status_code == 403
    r = root.post(f"/admin/bridge/turn/{turn.pk}/change/", {"state": "replied", "question": "?"})
    assert r.status_code == 403
    assert root.post(f"/admin/bridge/message/{message.pk}/delete/", {"post": "yes"}).status_code == 302
    row = AuditEvent.objects.get(action="admin.message.delete")
    assert (row.principal, row.target_type, row.target_id) == ("root", "bridge.Message", str(message.pk))
    # a live worker's row is not deleted (nothing would stop its pane), nor, so, its user
    assert root.post(f"/admin/bridge/member/{member.pk}/delete/", {"post": "yes"}).status_code == 403
    r = root.post(f"/admin/auth/user/{alice.pk}/delete/", {"post": "yes"})
    assert r.status_code == 403
    page = page_text(root.get(f"/admin/auth/user/{alice.pk}/delete/"))
    assert "doesn't have permission to delete the following types of objects" in page
    assert Member.objects.filter(pk=member.pk).exists()
    # stopped, its user is deleted on the user page, the worker and its turns with it
    Member.objects.filter(pk=member.pk).update(stopped_at=timezone.now())
    r = root.post(f"/admin/auth/user/{alice.pk}/delete/", {"post": "yes"})
    assert r.status_code == 302 and not Member.objects.exists() and not Turn.objects.exists()
