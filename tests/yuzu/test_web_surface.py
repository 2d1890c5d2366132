"""The human-facing web surface attacked as a hostile user would: admin pages a lesser role should not reach,
admin actions that bypass a service's refusal or the step-up, bad input (a NUL character) turning into 500s, and
request metadata an anonymous client controls reaching the metrics. Each test here failed before its fix."""

import time
from urllib.parse import quote

import pytest
from django.contrib.messages import get_messages
from django.test import Client

from tests.support.browser import staff_client
from tests.support.otp import code, next_code
from yuzu.auth import MFA_SESSION_KEY
from yuzu.models import ApiToken, AuditEvent, TOTPDevice

pytestmark = pytest.mark.django_db

PASSWORD = "pw-long-enough-1"


def messages_of(c, response):
    """The texts the admin flashed for a response that redirected (read on the page it redirects to)."""
    page = c.get(response["Location"]) if response.status_code == 302 else response
    return [str(m) for m in get_messages(page.wsgi_request)] if page.status_code == 302 else \
        [str(m) for m in page.context["messages"]] if page.context and "messages" in page.context else []


# --- the DEX dashboard -----------------------------------------------------------------------------------

@pytest.mark.parametrize("role", ["Approver", None])
def test_the_dex_dashboard_needs_guaranteedstate_read(make_user, role):
    """Found by this probe: the dashboard page overrode the changelist and skipped its permission check, so any
    staff user reached it — an Approver (fleet-wide Infrastructure:Read, no GuaranteedState:Read) read every
    device's hostname and performance, which the DEX tools and REST refuse them."""
    c = staff_client(make_user, "pry", role)
    r = c.get("/admin/dex/devicefacts/")
    assert r.status_code == 403
    assert not AuditEvent.objects.filter(action="dex.dashboard.view").exists()
    viewer = staff_client(make_user, "vera", "Viewer")  # fleet-wide GuaranteedState:Read: still welcome
    assert viewer.get("/admin/dex/devicefacts/").status_code == 200


# --- admin actions -----------------------------------------------------------------------------------------

@pytest.fixture
def schedule():
    from operations.models import InstructionSchedule

    return InstructionSchedule.objects.create(name="nightly", definition_id="demo.ping", frequency_type="interval",
                                              enabled=False, created_by="someone", creator_key="u1.s")


@pytest.fixture
def switch():
    from operations.models import PluginKillSwitch

    return PluginKillSwitch.objects.create(scope_key="demo", plugin="demo", enabled=True, set_by="someone")


@pytest.mark.parametrize("action", ["enable", "disable"])
def test_a_schedule_action_by_a_reader_is_refused_not_a_500(make_user, schedule, action):
    """Found by this probe: a Viewer (Schedule:Read) posting the changelist's Enable/Disable action got a 500 —
    the service's refusal escaped the admin action. The actions are offered only to those who may change."""
    c = staff_client(make_user, "vera", "Viewer")
    page = c.get("/admin/operations/instructionschedule/").content.decode()
    assert 'value="enable"' not in page and 'value="disable"' not in page
    r = c.post("/admin/operations/instructionschedule/", {"action": action, "_selected_action": [schedule.pk]})
    assert r.status_code in (200, 302), r.status_code
    schedule.refresh_from_db()
    assert schedule.enabled is False
    assert not AuditEvent.objects.filter(action="schedule.enable").exists()


def test_a_kill_switch_action_by_a_reader_changes_nothing_and_says_so(make_user, switch):
    """A Viewer (PluginConfig:Read) was offered "Switch OFF"; posting it was refused by the service, yet the page
    said "1 switch(es) turned off"."""
    c = staff_client(make_user, "vera", "Viewer")
    page = c.get("/admin/operations/pluginkillswitch/").content.decode()
    assert 'value="switch_off"' not in page
    r = c.post("/admin/operations/pluginkillswitch/", {"action": "switch_off", "_selected_action": [switch.pk]})
    assert r.status_code in (200, 302)
    switch.refresh_from_db()
    assert switch.enabled is True
    assert not any("turned off" in m for m in messages_of(c, r))


def test_a_kill_switch_action_counts_only_the_switches_it_flipped(make_user, switch, monkeypatch):
    from operations import plugins
    from yuzu.errors import YuzuError

    c = staff_client(make_user, "root", superuser=True)

    def refuse(*args, **kwargs):
        raise YuzuError("store unavailable", status=503)

    monkeypatch.setattr(plugins, "set_plugin_kill_switch", refuse)
    r = c.post("/admin/operations/pluginkillswitch/", {"action": "switch_off", "_selected_action": [switch.pk]})
    said = messages_of(c, r)
    assert "store unavailable" in " ".join(said) and not any("1 switch" in m for m in said), said


def test_a_schedule_its_creator_may_not_run_is_a_form_error_not_a_500(make_user):
    """A custom role with Schedule:Write but no Execution:Execute: the add form validated, then the service refused
    in save_model and the refusal escaped the admin as a 500. The form now asks the service's RBAC first."""
    from fleet.models import InstructionDefinition
    from operations.models import InstructionSchedule
    from yuzu.models import Role, RolePermission

    InstructionDefinition.objects.create(id="up", name="uptime", plugin="system", action="uptime")
    role = Role.objects.create(name="Scheduler")
    for op in ("Read", "Write"):
        RolePermission.objects.create(role=role, securable="Schedule", operation=op)
    c = staff_client(make_user, "sam", "Scheduler")
    r = c.post("/admin/operations/instructionschedule/add/", {
        "name": "n", "definition_id": "up", "parameters": "{}", "frequency_type": "interval", "interval_minutes": "60",
        "time_zone": "UTC", "day_of_week": "0", "day_of_month": "1", "enabled": "on"})
    assert r.status_code == 200 and "Execution:Execute" in r.content.decode()
    assert not InstructionSchedule.objects.exists()


def test_deleting_compliance_rows_in_the_admin_is_audited_one_by_one(make_user):
    """Found by this probe: the changelist's "Delete selected" is Django's one queryset.delete(), which skipped
    the pages' delete_model — a PlatformEngineer deleted every Guardian rule and policy with no audit row (and a
    fragment deleted from its own page left none either)."""
    from compliance.models import GuardRule, Policy, PolicyFragment
    from tests.support.compliance import make_policy

    spec = {"spark": {"type": "file-change"}, "assertion": {"type": "file-exists", "params": {"path": "/etc/passwd"}},
            "remediation": {"type": "alert-only"}}
    rules = [GuardRule.objects.create(name=f"r{i}", spec_json=spec) for i in range(2)]
    policy = make_policy()
    c = staff_client(make_user, "pete", "PlatformEngineer")
    r = c.post("/admin/compliance/guardrule/", {"action": "delete_selected", "post": "yes",
                                               "_selected_action": [x.pk for x in rules]})
    assert r.status_code == 302 and not GuardRule.objects.exists()
    deleted = AuditEvent.objects.filter(action="guaranteed_state.rule.delete", principal="pete")
    assert sorted(deleted.values_list("target_id", flat=True)) == sorted(x.pk for x in rules)

    r = c.post("/admin/compliance/policy/", {"action": "delete_selected", "post": "yes", "_selected_action": [policy.pk]})
    assert r.status_code == 302 and not Policy.objects.exists()
    assert AuditEvent.objects.filter(action="policy.delete", principal="pete", target_id=policy.pk).count() == 1

    fragment = PolicyFragment.objects.get()
    r = c.post(f"/admin/compliance/policyfragment/{fragment.pk}/delete/", {"post": "yes"})
    assert r.status_code == 302 and not PolicyFragment.objects.exists()
    assert AuditEvent.objects.filter(action="policy.fragment.delete", principal="pete",
                                     target_id=fragment.pk).count() == 1


@pytest.mark.parametrize("lookup", ["secret_sha256__startswith=a", "secret_sha256=x", "secret_sha256__regex=."])
def test_a_hidden_column_is_no_filter_either(make_user, lookup):
    """Found by this probe: the upload-grant page hides the grant secret's hash (exclude), yet a reader filtered the
    list on it from the query string (?secret_sha256__startswith=a), reading the hash a prefix at a time."""
    c = staff_client(make_user, "vera", "Viewer")
    assert c.get(f"/admin/operations/uploadgrant/?{lookup}").status_code == 400
    assert c.get("/admin/operations/uploadgrant/?state__exact=minted").status_code == 200


def test_a_readers_regular_expression_is_no_filter(make_user):
    """?minted_by__regex=(a+)+$ had the database run a reader's pattern on every row of a visible column."""
    c = staff_client(make_user, "vera", "Viewer")
    assert c.get("/admin/operations/uploadgrant/?minted_by__regex=(a%2B)%2B$").status_code == 400
    assert c.get("/admin/operations/uploadgrant/?minted_by__iregex=x").status_code == 400
    assert c.get("/admin/operations/uploadgrant/?minted_by__exact=x").status_code == 200


def test_a_config_values_change_form_changes_that_value_only(make_user):
    """Editing the plugin or key in a value's change form wrote a new row and left the old value set."""
    from fleet.agent.plugins import catalogue
    from fleet.models import Agent, AgentInventory
    from operations.models import PluginConfig

    a = Agent.objects.create(agent_id="a1", hostname="a1", os="linux", connected=True)
    AgentInventory.objects.create(agent=a, plugin=AgentInventory.CATALOGUE, data=catalogue())
    row = PluginConfig.objects.create(plugin="process", key="default_limit", value="5", updated_by="x")
    c = staff_client(make_user, "root", superuser=True)
    r = c.post(f"/admin/operations/pluginconfig/{row.pk}/change/",
               {"plugin": "content_dist", "key": "note", "value": "7"})
    assert r.status_code == 302, r.content[:2000]
    assert list(PluginConfig.objects.values_list("plugin", "key", "value")) == [("process", "default_limit", "7")]


def test_a_superusers_direct_edits_are_audited(make_user):
    """The superuser's pages (roles, role assignments, groups, …) edit rows directly: adding a role assignment
    there — granting Administrator — wrote Django's change log only, nothing in yuzu's audit log."""
    from yuzu.models import Role, RoleAssignment

    c = staff_client(make_user, "root", superuser=True)
    mallory = make_user("mallory")
    admin_role = Role.objects.get(name="Administrator")
    r = c.post("/admin/yuzu/roleassignment/add/", {"user": mallory.pk, "role": admin_role.pk})
    assert r.status_code == 302, r.content[:2000]
    grant = RoleAssignment.objects.get(user=mallory)
    added = AuditEvent.objects.get(action="admin.roleassignment.add")
    assert (added.principal, added.target_type, added.target_id) == ("root", "yuzu.RoleAssignment", str(grant.pk))
    viewer = Role.objects.get(name="Viewer")
    assert c.post(f"/admin/yuzu/roleassignment/{grant.pk}/change/",
                  {"user": mallory.pk, "role": viewer.pk}).status_code == 302
    assert "fields=Role" in AuditEvent.objects.get(action="admin.roleassignment.change").detail
    r = c.post("/admin/yuzu/roleassignment/", {"action": "delete_selected", "_selected_action": [grant.pk],
                                               "post": "yes"})
    assert r.status_code == 302 and not RoleAssignment.objects.filter(user=mallory).exists()
    assert AuditEvent.objects.filter(action="admin.roleassignment.delete", target_id=str(grant.pk)).count() == 1


def stale(c):
    """The browser's last authenticator proof is an hour old (left signed in)."""
    s = c.session
    s[MFA_SESSION_KEY] = time.time() - 3600
    s.save()


def test_granting_roles_in_the_admin_needs_a_fresh_authenticator_code(make_user):
    """A browser left signed in as a superuser granted Administrator to anyone (a role assignment, a role's
    permissions, superuser status, someone's authenticator) with no fresh authenticator code — while revoking a
    token already needed one. Every such write now sends the browser to the step-up page first, changing nothing."""
    from yuzu.models import Role, RoleAssignment

    c = staff_client(make_user, "root", superuser=True)
    mallory = make_user("mallory")
    admin_role, viewer = Role.objects.get(name="Administrator"), Role.objects.get(name="Viewer")
    grant = RoleAssignment.objects.create(user=mallory, role=viewer)
    role_form = {"name": "Sneaky", "description": "", "permissions-TOTAL_FORMS": "1", "permissions-INITIAL_FORMS": "0",
                 "permissions-0-securable": "Security", "permissions-0-operation": "Write"}
    attempts = [
        ("/admin/yuzu/roleassignment/add/", {"user": mallory.pk, "role": admin_role.pk}),
        (f"/admin/yuzu/roleassignment/{grant.pk}/change/", {"user": mallory.pk, "role": admin_role.pk}),
        (f"/admin/yuzu/roleassignment/{grant.pk}/delete/", {"post": "yes"}),
        ("/admin/yuzu/roleassignment/", {"action": "delete_selected", "_selected_action": [grant.pk], "post": "yes"}),
        ("/admin/yuzu/role/add/", role_form),
        (f"/admin/yuzu/role/{viewer.pk}/change/", {**role_form, "name": "Viewer"}),
        (f"/admin/yuzu/role/{viewer.pk}/delete/", {"post": "yes"}),
        ("/admin/yuzu/role/", {"action": "delete_selected", "_selected_action": [viewer.pk], "post": "yes"}),
        (f"/admin/auth/user/{mallory.pk}/change/", {"username": "mallory", "is_active": "on", "is_staff": "on",
                                                     "is_superuser": "on", "date_joined_0": "2026-01-01",
                                                     "date_joined_1": "00:00:00"}),
        (f"/admin/auth/user/{mallory.pk}/password/", {"password1": "Mallory-pass-123", "password2": "Mallory-pass-123",
                                                       "usable_password": "true"}),
        ("/admin/yuzu/totpdevice/add/", {"user": mallory.pk, "name": "phone"}),
    ]
    before = AuditEvent.objects.count()
    stale(c)
    for url, data in attempts:
        r = c.post(url, data)
        assert r.status_code == 302 and r["Location"] == f"/admin/stepup/?next={quote(url, safe='')}", (url, r)
        assert any("fresh authenticator code" in m and "Nothing was changed" in m for m in messages_of(c, r)), url
        if "action" not in data:  # the page itself asks for the code first, before anything is typed in
            assert c.get(url).status_code == 302, url
    assert list(RoleAssignment.objects.filter(user=mallory).values_list("role__name", flat=True)) == ["Viewer"]
    assert not Role.objects.filter(name="Sneaky").exists() and viewer.permissions.count() > 0
    mallory.refresh_from_db()
    assert not mallory.is_superuser and not mallory.has_usable_password()
    assert not TOTPDevice.objects.filter(user=mallory).exists()
    assert AuditEvent.objects.count() == before
    assert c.get("/admin/yuzu/roleassignment/").status_code == 200  # reading needs no code
    token, _ = ApiToken.mint(mallory, "ci")
    assert c.get(f"/admin/yuzu/apitoken/{token.pk}/change/").status_code == 200  # a read-only page: no code either
    assert c.get("/admin/yuzu/apitoken/add/").status_code == 403  # nor one nobody may use: its refusal comes first

    url = "/admin/yuzu/roleassignment/add/"
    r = c.post("/admin/stepup/", {"otp_token": next_code(c.device), "next": url})
    assert r.status_code == 302 and r["Location"] == url
    assert c.post(url, {"user": mallory.pk, "role": admin_role.pk}).status_code == 302
    assert RoleAssignment.objects.filter(user=mallory, role=admin_role).exists()
    assert AuditEvent.objects.filter(action="admin.roleassignment.add", principal="root").count() == 1


def test_taking_over_an_approver_in_the_admin_is_audited(make_user):
    """The admin never shows an authenticator's secret, but a superuser could still set an approver's password and
    reset their authenticator, then set it up themselves — and the user page's edits (a password, superuser status)
    were in Django's change log only, not in yuzu's audit log. Now each leaves its audit row."""
    c = staff_client(make_user, "root", superuser=True)
    alice = make_user("alice", "Approver", password="alice-password-1")
    r = c.post(f"/admin/auth/user/{alice.pk}/password/", {"password1": "Taken-over-123", "password2": "Taken-over-123",
                                                          "usable_password": "true"})
    assert r.status_code == 302, r.content[:2000]
    row = AuditEvent.objects.get(action="admin.user.change", target_id=str(alice.pk))
    assert row.principal == "root" and "alice" in row.detail and "Taken-over" not in row.detail
    device = TOTPDevice.objects.create(user=alice, name="phone", confirmed=True)
    assert c.post("/admin/yuzu/totpdevice/", {"action": "reset", "_selected_action": [device.pk]}).status_code == 302
    assert AuditEvent.objects.filter(action="admin.totpdevice.reset", principal="root").count() == 1


def test_granting_a_role_on_a_group_from_a_browser_needs_a_fresh_authenticator_code(make_user):
    """The same hole on the REST face, which takes the admin's session cookie: a browser left signed in assigned a
    role on a management group (POST /api/v1/management-groups/{id}/roles) with no fresh code."""
    from fleet.models import ManagementGroup
    from yuzu.models import RoleAssignment

    c = staff_client(make_user, "root", superuser=True)
    make_user("mallory")
    g = ManagementGroup.objects.create(name="lab")
    url = f"/api/v1/management-groups/{g.pk}/roles"
    stale(c)
    r = c.post(url, {"username": "mallory", "role": "ITServiceOwner"}, content_type="application/json")
    assert r.status_code == 403 and "mfa_proof_missing" in r.json()["error"]["message"], r.content
    assert not RoleAssignment.objects.filter(user__username="mallory").exists()
    assert c.post("/admin/stepup/", {"otp_token": next_code(c.device), "next": "/admin/"}).status_code == 302
    r = c.post(url, {"username": "mallory", "role": "ITServiceOwner"}, content_type="application/json")
    assert r.status_code == 201, r.content
    assert RoleAssignment.objects.filter(user__username="mallory", group=g).exists()


def test_a_revoked_device_token_stays_revoked(make_user):
    """The device-token page let a superuser clear revoked_at: a revoked enrolment token came back to life."""
    from django.utils import timezone

    from fleet.management.commands.mint_device_token import mint_device_token
    from fleet.models import DeviceToken

    mint_device_token("lab")
    token = DeviceToken.objects.get()
    DeviceToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    c = staff_client(make_user, "root", superuser=True)
    page = c.get(f"/admin/fleet/devicetoken/{token.pk}/change/").content.decode()
    assert 'name="revoked_at' not in page
    c.post(f"/admin/fleet/devicetoken/{token.pk}/change/", {"name": token.name, "revoked_at_0": "", "revoked_at_1": "",
                                                            "max_uses": token.max_uses or ""})
    token.refresh_from_db()
    assert token.revoked_at is not None


# --- API tokens in the admin ----------------------------------------------------------------------------------

def test_revoking_tokens_in_the_admin_needs_a_fresh_authenticator_code(make_user):
    """docs/security.md: a step-up code (≤ 5 min old) for revoking tokens from the browser. The admin's Revoke
    action asked for none (REST's DELETE does), so a browser left signed in revoked every token in the install."""
    c = staff_client(make_user, "root", superuser=True)
    owner = make_user("olive", "Operator")
    token, _ = ApiToken.mint(owner, "ci")
    s = c.session
    s[MFA_SESSION_KEY] = time.time() - 3600
    s.save()
    r = c.post("/admin/yuzu/apitoken/", {"action": "revoke", "_selected_action": [token.pk]})
    assert r.status_code in (200, 302)
    token.refresh_from_db()
    assert token.revoked_at is None
    assert any("authenticator code" in m for m in messages_of(c, r))
    assert not AuditEvent.objects.filter(action="api_token.revoke").exists()

    assert c.post("/admin/stepup/", {"otp_token": next_code(c.device), "next": "/admin/"}).status_code == 302
    r = c.post("/admin/yuzu/apitoken/", {"action": "revoke", "_selected_action": [token.pk]})
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert AuditEvent.objects.filter(action="api_token.revoke", principal="root", target_id=token.pk).count() == 1


# --- bad input ---------------------------------------------------------------------------------------------

NUL_GETS = [
    "/admin/operations/pluginconfig/?plugin=a%00b",       # a list filter
    "/admin/operations/pluginsecret/a%00b/change/",        # a change page of a text primary key
    "/api/v1/agents/a%00b",
    "/api/v1/audit?principal=%00",
    "/api/v1/management-groups/a%00",
    "/api/v1/rbac/roles/a%00/permissions",
    "/api/v1/inventory?agent_id=%00",
]


@pytest.mark.parametrize("url", NUL_GETS)
def test_a_nul_character_in_a_url_is_a_400(make_user, mint, url):
    """Found by this probe on PostgreSQL (which refuses NUL in text): a %00 in a path segment or a query
    parameter reached a query and answered 500 on every admin page and REST route that looks a text key up."""
    raw = mint("adm", role="Administrator")
    c = staff_client(make_user, "root", superuser=True) if url.startswith("/admin/") else \
        Client(raise_request_exception=False, headers={"Authorization": f"Bearer {raw}"})
    r = c.get(url)
    assert r.status_code == 400, (url, r.status_code, r.content[:200])
    assert b"Traceback" not in r.content and b"NUL" in r.content


@pytest.mark.parametrize("path,data", [
    ("/admin/operations/pluginkillswitch/", {"action": "switch_off", "_selected_action": ["a\x00"]}),
    ("/admin/yuzu/apitoken/", {"action": "revoke", "_selected_action": ["a\x00"]}),
    ("/admin/fleet/agent/", {"action": "delete_selected", "_selected_action": ["a\x00"]}),
])
def test_a_nul_character_in_an_admin_form_is_a_400(make_user, path, data):
    c = staff_client(make_user, "root", superuser=True)
    r = c.post(path, data)
    assert r.status_code == 400, (path, r.status_code)


@pytest.mark.parametrize("path,body", [
    ("/api/v1/management-groups", {"name": "a\x00"}),
    ("/api/v1/rbac/check", {"securable_type": "a\x00", "operation": "Read"}),
    ("/api/v1/scope/validate", {"expression": 'hostname = "a\x00"'}),
    ("/api/v1/quarantine", {"agent_id": "a\x00"}),
    ("/api/v1/management-groups", {"name\x00": "a"}),
])
def test_a_nul_character_in_a_json_body_is_a_400(mint, path, body):
    """Found by this probe on PostgreSQL: "\u0000" in a JSON string reached a write or a lookup — a 500 (a group
    created with it, a permission checked for it, a scope previewed). The strict parser refuses it with a 400."""
    from fleet.models import ManagementGroup

    raw = mint("adm", role="Administrator")
    c = Client(raise_request_exception=False, headers={"Authorization": f"Bearer {raw}"})
    r = c.post(path, body, content_type="application/json")
    assert r.status_code == 400, (path, r.status_code, r.content[:200])
    assert "NUL" in r.json()["error"]["message"]
    assert not ManagementGroup.objects.exists()


def test_unlocking_a_nul_user_leaves_no_audit_row(mint):
    raw = mint("adm", role="Administrator")
    c = Client(raise_request_exception=False, headers={"Authorization": f"Bearer {raw}"})
    before = AuditEvent.objects.count()
    assert c.post("/api/v1/users/a%00/unlock").status_code == 400
    assert AuditEvent.objects.count() == before


# --- metrics -----------------------------------------------------------------------------------------------

def test_an_invented_http_method_does_not_grow_the_metrics():
    """Found by this probe: /metrics is public, and each request's method became a label value as sent — an
    anonymous client inventing a method per request added a counter and a histogram (16 series) to every
    process for good, and to every scrape."""
    c = Client(raise_request_exception=False)
    for i in range(5):
        c.generic(f"PROBE{i}X", "/healthz")
    body = c.get("/metrics").content.decode()
    assert "PROBE" not in body
    assert 'method="other",route="healthz"' in body


@pytest.mark.django_db(transaction=True)  # the MCP endpoint runs in-process on other threads
def test_an_invented_mcp_method_does_not_grow_the_metrics(mint):
    """The same on the MCP endpoint, for any token holder (a readonly one): each unknown method and each invented
    notification name became a label value of yuzu_mcp_requests_total, for good."""
    from prometheus_client import generate_latest

    from tests.support.mcp_http import McpClient, request

    c = McpClient(mint("alice", role="Viewer", tier="readonly"))
    c.initialize()
    for i in range(3):
        assert c.rpc(f"probeX{i}").error["code"] == -32601
        assert request(body={"jsonrpc": "2.0", "method": f"notifications/probeY{i}"}, headers=c.headers()).status == 202
    body = generate_latest().decode()
    assert "probe" not in body
    assert 'yuzu_mcp_requests_total{method="unknown",outcome="error"}' in body
    assert 'yuzu_mcp_requests_total{method="unknown",outcome="accepted"}' in body


# --- login -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("nxt", ["https://evil.example/", "//evil.example/", "/\\evil.example"])
def test_a_login_with_an_unsafe_next_lands_on_the_admin(make_user, nxt):
    """An unsafe next= is dropped (no open redirect); the person then lands on the admin, not on Django's
    default /accounts/profile/ (a 404 page here)."""
    user = make_user("boss", "Administrator", superuser=True, password=PASSWORD)
    device = TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    r = Client().post(f"/admin/login/?next={nxt}", {"username": "boss", "password": PASSWORD, "otp_token": code(device)})
    assert r.status_code == 302 and r["Location"] == "/admin/"


@pytest.mark.parametrize("chosen", ["auth.user/1", "yuzu.apitoken/1", "sessions.session/x"])
def test_a_login_naming_a_model_that_is_no_authenticator_is_no_500(make_user, chosen):
    """Found by this probe: the login form's otp_device is "<app>.<model>/<id>"; django-otp loads whatever model it
    names, and one that is no device crashed the sign-in (a 500, the password already checked). It is ignored now:
    the code is checked against the account's own authenticator."""
    user = make_user("boss", "Administrator", superuser=True, password=PASSWORD)
    device = TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    c = Client(raise_request_exception=False)
    r = c.post("/admin/login/?next=/admin/", {"username": "boss", "password": PASSWORD, "otp_token": "000000",
                                              "otp_device": chosen})
    assert r.status_code == 200 and b"authenticator code is not right" in r.content
    device.throttle_reset()
    r = c.post("/admin/login/?next=/admin/", {"username": "boss", "password": PASSWORD, "otp_token": code(device),
                                              "otp_device": chosen})
    assert r.status_code == 302 and r["Location"] == "/admin/"


# --- cookies -----------------------------------------------------------------------------------------------

def settings_under(**env):
    """The cookie settings a fresh process computes from ``env``."""
    import json
    import os
    import subprocess
    import sys

    code_ = ("import django, json; django.setup(); from django.conf import settings as s; "
             "print(json.dumps([s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE]))")
    base = {k: v for k, v in os.environ.items() if k not in ("YUZU_PUBLIC_URL", "YUZU_COOKIE_SECURE")}
    out = subprocess.run([sys.executable, "-c", code_], env={**base, "DJANGO_SETTINGS_MODULE": "yuzu.settings", **env},
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_behind_tls_the_admin_cookies_are_secure():
    """With YUZU_PUBLIC_URL https://… (a TLS proxy in front) the session cookie still had no Secure flag: the
    browser sent a signed-in admin's session over plain HTTP to any http:// link to the host."""
    assert settings_under(YUZU_PUBLIC_URL="https://yuzu.example.com") == [True, True]
    assert settings_under() == [False, False]  # embedded, plain http on 127.0.0.1
    assert settings_under(YUZU_PUBLIC_URL="https://yuzu.example.com", YUZU_COOKIE_SECURE="0") == [False, False]
