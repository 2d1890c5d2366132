"""The governance admin pages in process: the access-review page's Keep / Revoke / Close (with step-up when the
sign-in proof is stale), the read-only engine principals list, and the bridge profile form editing a sealed env."""

import re

import pytest
from django.test import Client

from bridge.models import Profile
from governance import reviews
from governance.models import AccessReviewCampaign
from tests.support.otp import code, next_code
from yuzu.auth import MFA_SESSION_KEY
from yuzu.models import RoleAssignment, TOTPDevice
from yuzu.rbac import Principal

pytestmark = pytest.mark.django_db
PASSWORD = "s3cret-password"


@pytest.fixture
def boss(make_user):
    user = make_user("boss", "Administrator", superuser=True, password=PASSWORD)
    device = TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    c = Client()
    r = c.post("/admin/login/?next=/admin/", {"username": "boss", "password": PASSWORD, "otp_token": code(device)})
    assert r.status_code == 302
    return user, device, c


def test_keep_revoke_close_with_step_up(boss, make_user):
    user, device, c = boss
    make_user("vic", "Viewer")
    cid = reviews.open_access_review(Principal(user=user), "admin review")["campaign_id"]
    campaign = AccessReviewCampaign.objects.get()
    url = f"/admin/governance/accessreviewcampaign/{cid}/review/"
    page = c.get(url).content.decode()
    assert "Keep" in page and "Revoke" in page and 'data-principal="vic"' in page
    vic_row = campaign.attestations.get(principal_id="vic")
    # A stale proof: the decision needs the current code with it, and nothing is recorded without one.
    session = c.session
    session[MFA_SESSION_KEY] = 0
    session.save()
    assert 'id="id_otp_token"' in c.get(url).content.decode()
    r = c.post(url, {"row": vic_row.pk, "decision": "revoke", "otp_token": ""})
    assert "Enter the 6-digit code" in r.content.decode()
    vic_row.refresh_from_db()
    assert vic_row.decision == "pending"
    c.post(url, {"row": vic_row.pk, "decision": "revoke", "otp_token": next_code(device)})
    vic_row.refresh_from_db()
    r = c.post(url, {"row": "²", "decision": "keep"}, follow=True)  # str.isdigit() admits it, int() does not
    assert r.status_code == 200 and "Choose Keep or Revoke on one grant." in r.content.decode()
    assert vic_row.decision == "flagged_revoke" and vic_row.reviewer == "boss"
    c.post(url, {"action": "close"})
    assert not RoleAssignment.objects.filter(user__username="vic").exists()
    assert "Keep" not in c.get(url).content.decode()
    assert c.get("/admin/governance/accessreviewcampaign/").status_code == 200
    assert c.get("/admin/governance/engineprincipal/").status_code == 200


def test_the_profile_form_edits_a_sealed_env(boss):
    _, _, c = boss
    profile = Profile.objects.get(name="standin")
    url = f"/admin/bridge/profile/{profile.pk}/change/"
    page = c.get(url).content.decode()
    assert 'name="env"' in page
    data = {"name": "standin", "description": profile.description, "agent_kind": profile.agent_kind,
            "argv": '["python"]', "env": '{"API_KEY": "sk-admin-typed"}', "cwd": "", "blocked_injectable": "on",
            "system_prompt_addendum": "", "interrupt_keys": '["Escape"]', "enabled": "on",
            "created_at_0": profile.created_at.strftime("%Y-%m-%d"), "created_at_1": profile.created_at.strftime("%H:%M:%S")}
    r = c.post(url, data)
    assert r.status_code == 302, re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', r.content.decode(), re.S)
    profile = Profile.objects.get(pk=profile.pk)
    assert profile.env == {"API_KEY": "sk-admin-typed"} and b"sk-admin-typed" not in bytes(profile.env_sealed)
    r = c.post(url, {**data, "env": '{"A": 1}'})
    assert r.status_code == 200 and Profile.objects.get(pk=profile.pk).env == {"API_KEY": "sk-admin-typed"}
    # run_as (the OS user the worker runs as, bridge.guard.IsolationGuard) is edited here, a user name only
    assert 'name="run_as"' in page and "run_as" in c.get("/admin/bridge/profile/").content.decode()
    assert c.post(url, {**data, "run_as": "yuzu-worker"}).status_code == 302
    assert Profile.objects.get(pk=profile.pk).run_as == "yuzu-worker"
    assert c.post(url, {**data, "run_as": "x; rm -rf /"}).status_code == 200
    assert Profile.objects.get(pk=profile.pk).run_as == "yuzu-worker"
