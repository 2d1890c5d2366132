"""The compliance admin: YAML editing with the same checks, RBAC, each policy's compliance page."""


import html
import json

import pytest
from django.test import Client
from django.utils import timezone

from compliance.models import GuardRule, Policy, PolicyAgentStatus, PolicyFragment
from tests.support.browser import staff_client
from tests.support.compliance import FRAGMENT, POLICY, agents
from tests.support.otp import code
from yuzu.models import AuditEvent, TOTPDevice

pytestmark = pytest.mark.django_db


# --- the admin ---------------------------------------------------------------------------------------

def admin_session(make_user, username, role, superuser=False):
    user = make_user(username, role, superuser=superuser, password="s3cret-password")
    user.is_staff = True
    user.save()
    device = TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    c = Client()
    r = c.post("/admin/login/?next=/admin/", {"username": username, "password": "s3cret-password",
                                             "otp_token": code(device)})
    assert r.status_code == 302, r.content[:500]
    return c


def test_the_admin_edits_policies_as_yaml_and_shows_each_policys_compliance(make_user):
    c = admin_session(make_user, "pe", "PlatformEngineer")
    r = c.post("/admin/compliance/policyfragment/add/", {"yaml_source": FRAGMENT.replace("&& !", "&&& !")})
    assert r.status_code == 200 and "is not valid CEL (syntax error at line 1" in r.content.decode()
    assert not PolicyFragment.objects.exists()
    r = c.post("/admin/compliance/policyfragment/add/", {"yaml_source": FRAGMENT})
    assert r.status_code == 302 and PolicyFragment.objects.count() == 1
    r = c.post("/admin/compliance/policy/add/", {"yaml_source": POLICY.replace("marker-present", "nope")})
    assert "unknown fragment" in r.content.decode() and not Policy.objects.exists()
    r = c.post("/admin/compliance/policy/add/", {"yaml_source": POLICY})
    assert r.status_code == 302, r.content.decode()[:2000]
    policy = Policy.objects.get()
    assert policy.interval_seconds == 120 and policy.triggers.count() == 3
    a1, a2 = agents("a1", "a2")
    PolicyAgentStatus.objects.create(policy=policy, agent=a1, status="compliant", last_check_at=timezone.now())
    PolicyAgentStatus.objects.create(policy=policy, agent=a2, status="non_compliant", last_check_at=timezone.now())
    page = c.get(f"/admin/compliance/policy/{policy.pk}/change/").content.decode()
    assert "50.0 %</strong> compliant of 2 evaluated agent(s)" in page
    r = c.post(f"/admin/compliance/policy/{policy.pk}/change/",
               {"yaml_source": POLICY.replace("interval_seconds: 120", "interval_seconds: 600")})
    assert r.status_code == 302
    policy.refresh_from_db()
    assert policy.interval_seconds == 600 and policy.triggers.count() == 3
    fragment = PolicyFragment.objects.get()
    r = c.post(f"/admin/compliance/policyfragment/{fragment.pk}/change/",
               {"yaml_source": FRAGMENT.replace('{path: "${path}"}', '{path: "${directory}/marker"}', 1)})
    assert "policy 'marker': parameter 'path' uses input '${directory}'" in html.unescape(r.content.decode())  # would orphan it
    assert c.get("/admin/compliance/policyagentstatus/").status_code == 200
    assert c.get(f"/admin/compliance/policyagentstatus/{PolicyAgentStatus.objects.first().pk}/change/")\
        .status_code == 200
    assert {"policy.fragment.create", "policy.create", "policy.update"} <= set(
        AuditEvent.objects.filter(principal="pe").values_list("action", flat=True))


def test_the_admin_follows_rbac(make_user):
    viewer = admin_session(make_user, "vi", "Viewer")
    assert viewer.get("/admin/compliance/policy/").status_code == 200  # Policy:Read
    assert viewer.get("/admin/compliance/policy/add/").status_code == 403  # no Policy:Write
    approver = admin_session(make_user, "ap", "Approver")
    assert approver.get("/admin/compliance/policy/").status_code == 403
    assert approver.get("/admin/compliance/guardrule/").status_code == 403




# --- guard rules: the page writes through compliance.services ----------------------------------------

SPEC = {"spark": {"type": "file-change"}, "assertion": {"type": "file-exists", "params": {"path": "/etc/passwd"}},
        "remediation": {"type": "alert-only"}}


def rule_form(rule, **changes):
    data = {"name": rule.name, "spec_json": json.dumps(rule.spec_json), "enforcement_mode": rule.enforcement_mode,
            "severity": rule.severity, "os_target": rule.os_target, "scope_expr": rule.scope_expr,
            "seen_version": rule.version}
    if rule.enabled:
        data["enabled"] = "on"
    return {**data, **changes}


def test_a_guard_rule_edited_on_its_page_is_versioned_and_audited_as_the_service_does(make_user):
    c = staff_client(make_user, "pete", "PlatformEngineer")
    r = c.post("/admin/compliance/guardrule/add/", rule_form(GuardRule(name="passwd", spec_json=SPEC)))
    assert r.status_code == 302, r.content.decode()[:2000]
    rule = GuardRule.objects.get()
    assert (rule.version, rule.created_by) == (1, "pete")
    assert AuditEvent.objects.get(action="guaranteed_state.rule.create").detail == "name=passwd assertion=file-exists"

    r = c.post(f"/admin/compliance/guardrule/{rule.pk}/change/", rule_form(rule, severity="high"))
    assert r.status_code == 302
    rule.refresh_from_db()
    assert (rule.severity, rule.version, rule.updated_by) == ("high", 2, "pete")
    row = AuditEvent.objects.get(action="guaranteed_state.rule.update")
    assert (row.principal, row.target_id, row.detail) == ("pete", rule.pk, "name=passwd version=2")
    assert "severity: high" in rule.yaml_source

    assert 'name="seen_version" value="2"' in c.get(f"/admin/compliance/guardrule/{rule.pk}/change/").content.decode()
    r = c.post(f"/admin/compliance/guardrule/{rule.pk}/change/", rule_form(rule, severity="low", seen_version=1))
    assert r.status_code == 200  # an edit of the page as it was at version 1: it would put "medium" back
    assert "was changed (it is at version 2, your edit started from version 1)" in html.unescape(r.content.decode())
    rule.refresh_from_db()
    assert (rule.severity, rule.version) == ("high", 2)


def test_a_guard_rule_the_service_refuses_is_a_form_error_and_nothing_changes(make_user):
    c = staff_client(make_user, "pete", "PlatformEngineer")
    GuardRule.objects.create(name="taken", spec_json=SPEC)
    rule = GuardRule.objects.create(name="passwd", spec_json=SPEC)
    for changes, said in (({"scope_expr": "ostype ==="}, "scope_expr is not a valid scope expression"),
                          ({"name": "taken"}, "a guard rule named 'taken' exists already"),
                          ({"spec_json": json.dumps({**SPEC, "assertion": {"type": "nope"}})}, "nope")):
        r = c.post(f"/admin/compliance/guardrule/{rule.pk}/change/", rule_form(rule, severity="high", **changes))
        assert r.status_code == 200 and said in html.unescape(r.content.decode()), changes
        rule.refresh_from_db()
        assert (rule.name, rule.severity, rule.scope_expr, rule.version) == ("passwd", "medium", "", 1)
    assert not AuditEvent.objects.filter(action__startswith="guaranteed_state.rule.").exists()


def test_fragments_and_policies_edited_on_their_pages_go_through_the_services(make_user):
    """Saved by the page itself, an edit left its own audit row ("via=admin") and kept the fleet's cached compliance
    counts: the service's create and update forget them, as the REST routes' do."""
    from django.core.cache import cache

    from compliance.services import FLEET_CACHE_KEY, fleet_compliance

    c = staff_client(make_user, "pe", "PlatformEngineer")
    assert c.post("/admin/compliance/policyfragment/add/", {"yaml_source": FRAGMENT}).status_code == 302
    assert c.post("/admin/compliance/policy/add/", {"yaml_source": POLICY}).status_code == 302
    policy, fragment = Policy.objects.get(), PolicyFragment.objects.get()
    fleet_compliance()
    assert cache.get(FLEET_CACHE_KEY) is not None
    r = c.post(f"/admin/compliance/policy/{policy.pk}/change/",
               {"yaml_source": POLICY.replace("interval_seconds: 120", "interval_seconds: 600")})
    assert r.status_code == 302 and cache.get(FLEET_CACHE_KEY) is None
    fleet_compliance()
    r = c.post(f"/admin/compliance/policyfragment/{fragment.pk}/change/",
               {"yaml_source": FRAGMENT.replace("a marker file must exist", "the marker file must exist")})
    assert r.status_code == 302 and cache.get(FLEET_CACHE_KEY) is None
    details = dict(AuditEvent.objects.filter(principal="pe").values_list("action", "detail"))
    assert details["policy.create"] == details["policy.update"] == "name=marker fragment=marker-present"
    assert details["policy.fragment.update"].startswith("name=marker-present check=")
