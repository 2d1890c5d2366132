"""Admin login needs password + authenticator code (one submission) and says "authenticator code", never
"token"; lockout; step-up refreshes the MFA proof; health, readiness, metrics."""

import html
import re
import time

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.support.otp import code, next_code
from yuzu.admin import (
    ACCOUNT_LOCKED,
    CODE_REQUIRED,
    CODE_REUSED,
    CODE_THROTTLED,
    CODE_WRONG,
    DEVICE_REQUIRED,
    NO_DEVICE,
)
from yuzu.auth import MFA_SESSION_KEY
from yuzu.models import AccountLockout, AuditEvent, TOTPDevice

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(make_user):
    user = make_user("boss", "Administrator", superuser=True, password="s3cret-password")
    return user, TOTPDevice.objects.create(user=user, name="phone", confirmed=True)


def errors(resp):
    """The error texts a person sees on an admin form page."""
    page = resp.content.decode()
    found = re.findall(r'<p class="errornote"[^>]*>\s*(.*?)\s*</p>', page, re.S)
    found += re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', page, re.S)
    return [html.unescape(re.sub(r"<[^>]+>", " ", e)).strip() for e in found]


def login(c, code_value, username="boss", password="s3cret-password", **extra):
    return c.post("/admin/login/?next=/admin/", {"username": username, "password": password,
                                                 "otp_token": code_value, **extra})


def test_admin_login_requires_otp(staff):
    user, device = staff
    c = Client()
    r = c.post("/admin/login/?next=/admin/", {"username": "boss", "password": "s3cret-password"})
    assert r.status_code == 200 and c.get("/admin/").status_code == 302  # still logged out
    assert errors(r) == [CODE_REQUIRED]
    r = login(c, "000000")
    assert c.get("/admin/").status_code == 302 and errors(r) == [CODE_WRONG]
    device.throttle_reset()  # the wrong code throttles the device for a second
    r = login(c, code(device), otp_device=device.persistent_id)  # an explicit device choice still works
    assert r.status_code == 302
    assert c.get("/admin/").status_code == 200
    assert c.session.get(MFA_SESSION_KEY) is not None


def test_one_device_logs_in_with_password_and_code_in_one_submission(staff):
    user, device = staff
    c = Client()
    r = c.get("/admin/login/?next=/admin/")
    page = r.content.decode()
    assert 'id="id_otp_token"' in page and "Authenticator code" in page
    page = re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "", page)  # random: it once held "OTP"
    assert "id_otp_device" not in page and "OTP" not in page and "Token" not in page  # no device list, no jargon
    r = login(c, code(device))
    assert r.status_code == 302 and r["Location"] == "/admin/"
    assert c.get("/admin/").status_code == 200 and c.session.get(MFA_SESSION_KEY) is not None
    assert AuditEvent.objects.filter(action="auth.login", result="success", principal="boss").count() == 1


def test_login_error_texts_say_authenticator_code(staff, settings):
    user, device = staff
    # A wrong code throttles the device for THROTTLE_FACTOR seconds; the default (1 s) is shorter than a
    # password check takes on a loaded machine, so the retry below would come after the throttle had ended.
    settings.OTP_TOTP_THROTTLE_FACTOR = 60
    c = Client()
    r = login(c, "123456")
    assert errors(r) == [CODE_WRONG]
    assert 's3cret-password' not in r.content.decode()  # the password is not echoed back into the page
    assert errors(login(c, code(device))) == [CODE_THROTTLED]  # retried at once: the device's throttle
    device.throttle_reset()

    first = Client()
    used = code(device)
    assert login(first, used).status_code == 302
    again = Client()
    r = login(again, used)  # the same code once more (a second browser, or a double submit)
    assert errors(r) == [CODE_REUSED]
    assert again.get("/admin/").status_code == 302
    for text in errors(r) + [CODE_REQUIRED, CODE_WRONG, CODE_REUSED, CODE_THROTTLED, DEVICE_REQUIRED, NO_DEVICE]:
        assert "token" not in text.lower() and "authenticator" in text.lower()


def test_several_devices_ask_which_one(staff):
    user, device = staff
    other = TOTPDevice.objects.create(user=user, name="backup phone", confirmed=True)
    c = Client()
    r = login(c, code(other))
    assert errors(r) == [DEVICE_REQUIRED]
    page = r.content.decode()
    assert 'id="id_otp_device"' in page and "backup phone" in page
    assert login(c, code(other), otp_device=other.persistent_id).status_code == 302


def test_an_account_without_an_authenticator_is_told_so(make_user):
    user = make_user("newbie", password="newbie-password-1")
    get_user_model().objects.filter(pk=user.pk).update(is_staff=True)
    r = login(Client(), "123456", username="newbie", password="newbie-password-1")
    assert errors(r) == [NO_DEVICE]
    # The way on is a link, not an address to retype; the plain login page does not offer it.
    assert '<a href="/admin/enrol/">' in r.content.decode()
    assert "/admin/enrol/" not in Client().get("/admin/login/").content.decode()
    assert "/admin/enrol/" not in login(Client(), "123456", username="newbie", password="wrong").content.decode()


def test_lockout_after_failed_logins(staff):
    c = Client()
    for _ in range(5):
        r = login(c, "000000", password="wrong")
        assert errors(r)[0].startswith("Please enter the correct username and password")
    _, device = staff
    lock = AccountLockout.objects.get(user__username="boss")
    r = login(c, code(device))
    assert c.get("/admin/").status_code == 302  # locked out even with the right password and code
    assert r.status_code == 200
    lock.refresh_from_db()
    assert errors(r) == [ACCOUNT_LOCKED.format(until=lock.locked_until)]
    assert "Try again after" in errors(r)[0] and "ask an administrator to unlock it" in errors(r)[0]
    # Without the password nobody learns that the account is locked (or exists).
    assert errors(login(c, code(device), password="still-wrong"))[0].startswith("Please enter the correct")
    assert errors(login(c, code(device), username="nobody"))[0].startswith("Please enter the correct")

    # Unlocked, the same password and a fresh code log in in one step.
    AccountLockout.objects.filter(pk=lock.pk).update(failed_attempts=0, locked_until=None)
    assert login(c, code(device)).status_code == 302 and c.get("/admin/").status_code == 200


def test_stepup_refreshes_proof(staff):
    user, device = staff
    c = Client()
    used = code(device)
    login(c, used)
    s = c.session
    s[MFA_SESSION_KEY] = time.time() - 3600
    s.save()
    r = c.post("/admin/stepup/", {"otp_token": "123", "next": "/admin/"})
    assert r.status_code == 200 and c.session[MFA_SESSION_KEY] < time.time() - 3000
    assert errors(r) == [CODE_REQUIRED]
    r = c.post("/admin/stepup/", {"otp_token": used, "next": "/admin/"})  # the login's code, again
    assert r.status_code == 200 and errors(r) == [CODE_REUSED]
    device.throttle_reset()
    r = c.post("/admin/stepup/", {"otp_token": "000000", "next": "/admin/"})
    assert r.status_code == 200 and errors(r) == [CODE_WRONG]
    assert "Authenticator code" in r.content.decode() and "token" not in " ".join(errors(r)).lower()
    device.throttle_reset()
    r = c.post("/admin/stepup/", {"otp_token": next_code(device), "next": "/admin/"})
    assert r.status_code == 302 and c.session[MFA_SESSION_KEY] > time.time() - 5


def test_the_api_asks_for_an_authenticator_code_not_a_token(staff):
    user, device = staff
    c = Client()
    login(c, code(device))
    s = c.session
    s[MFA_SESSION_KEY] = time.time() - 3600
    s.save()
    r = c.post("/api/v1/tokens", {"name": "x"}, content_type="application/json",
               headers={"X-CSRFToken": c.cookies["csrftoken"].value} if "csrftoken" in c.cookies else {})
    assert r.status_code == 403, r.content
    err = r.json()["error"]
    assert "authenticator code" in err["message"] and "TOTP" not in err["message"]
    assert "authenticator app" in err["remediation"]


def test_session_cookie_authenticates_rest_only_when_verified(staff):
    user, device = staff
    c = Client()
    c.force_login(user)  # password-only session: not OTP-verified
    assert c.get("/api/v1/tokens").status_code == 401
    c = Client()
    c.post("/admin/login/", {"username": "boss", "password": "s3cret-password", "otp_device": device.persistent_id,
                             "otp_token": code(device)})
    assert c.get("/api/v1/tokens").status_code == 200


@pytest.mark.parametrize("change", ["password", "staff", "authenticator", "unconfirmed", "deactivated"])
def test_a_session_stops_authenticating_rest_once_the_admin_would_end_it(staff, change):
    """Found by a probe: the REST face still took an admin session cookie after the user's password changed, or
    their staff status or authenticator was taken away — an approval went through on it while /admin/ refused
    the same cookie."""
    user, device = staff
    c = Client()
    login(c, code(device))
    assert c.get("/api/v1/tokens").status_code == 200
    users = get_user_model().objects.filter(pk=user.pk)
    if change == "password":
        user.set_password("another-password-2")
        user.save()
    elif change == "staff":
        users.update(is_staff=False)
    elif change == "authenticator":
        device.delete()
    elif change == "unconfirmed":
        TOTPDevice.objects.filter(pk=device.pk).update(confirmed=False)
    else:
        users.update(is_active=False)
    r = c.get("/api/v1/tokens")
    assert r.status_code == 401, (change, r.content)


def test_health_ready_metrics():
    c = Client()
    assert c.get("/healthz").json() == {"status": "ok"}
    ready = c.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["database"] == "ok"
    m = c.get("/metrics")
    assert m.status_code == 200 and b"yuzu_http_requests_total" in m.content


def test_readyz_keeps_one_redis_connection(tmp_path):
    """/readyz is anonymous: each request opened a new Redis connection (Redis's total_connections_received grew
    by one per probe). It reuses one now. A private redis-server, so that nothing else's connections count."""
    import redis
    from django.test import override_settings

    from tests.faults.services import private_redis

    with private_redis(tmp_path) as server, override_settings(REDIS_URL=server.url):
        probe = redis.Redis.from_url(server.url)
        before = probe.info("stats")["total_connections_received"]
        for _ in range(20):
            assert Client().get("/readyz").json()["checks"]["redis"] == "ok"
        assert probe.info("stats")["total_connections_received"] - before == 1


def test_admin_static_files_are_served_by_the_asgi_app():
    from asgiref.sync import async_to_sync

    from tests.support.sse_client import Stream
    from yuzu.asgi import application

    async def fetch(path):
        s = await Stream(application, "GET", path, {"host": "127.0.0.1:8000"}).open()
        return s.status, await s.read_body()

    status, body = async_to_sync(fetch)("/static/admin/css/base.css")
    assert status == 200 and "body" in body
    assert async_to_sync(fetch)("/static/admin/css/nope.css")[0] == 404


def test_tokens_are_read_only_in_the_admin_except_an_audited_revoke(staff, make_user):
    """Issue 10 item 11: staff could change a token's tier, un-revoke it or move its expiry with no step-up
    and no yuzu audit row."""
    from datetime import timedelta

    from django.utils import timezone

    from yuzu.models import ApiToken, AuditEvent

    user, device = staff
    owner = make_user("olive", "Operator")
    token, _ = ApiToken.mint(owner, "ci", mcp_tier="readonly", expires_at=timezone.now() + timedelta(days=5))
    other, _ = ApiToken.mint(owner, "cli")
    c = Client()
    assert login(c, code(device)).status_code == 302
    change = f"/admin/yuzu/apitoken/{token.pk}/change/"
    page = c.get(change)
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    r = c.post(change, {"name": "ci", "mcp_tier": "", "expires_at_0": "2099-01-01", "expires_at_1": "00:00:00"})
    assert r.status_code == 403
    token.refresh_from_db()
    assert token.mcp_tier == "readonly" and token.expires_at < timezone.now() + timedelta(days=6)
    assert c.post(f"/admin/yuzu/apitoken/{token.pk}/delete/", {"post": "yes"}).status_code == 403

    r = c.post("/admin/yuzu/apitoken/", {"action": "revoke", "_selected_action": [token.pk, other.pk]})
    assert r.status_code == 302
    assert ApiToken.objects.filter(pk__in=[token.pk, other.pk], revoked_at__isnull=False).count() == 2
    rows = AuditEvent.objects.filter(action="api_token.revoke", principal=user.username)
    assert sorted(rows.values_list("target_id", flat=True)) == sorted([token.pk, other.pk])


def test_failed_sign_ins_by_someone_else_do_not_end_a_live_session(staff):
    """Lockout as a denial of service: five wrong passwords for an administrator's name — anyone's to try — locked
    the account AND ended its live sessions (the backend's get_user refused a locked user on every request), so an
    anonymous caller logged the administrator out every 15 minutes and stopped their approvals."""
    user, device = staff
    c = Client()
    assert login(c, code(device)).status_code == 302
    attacker = Client()
    for _ in range(5):
        login(attacker, "000000", password="wrong")
    assert AccountLockout.objects.get(user=user).is_locked()
    assert c.get("/admin/").status_code == 200  # still signed in, on every face
    assert c.get("/api/v1/tokens").status_code == 200
    other = Client()  # a new sign-in is refused, even with the right password and code
    assert errors(login(other, next_code(device)))[0].startswith("This account is locked after too many failed")
    assert other.get("/admin/").status_code == 302


def test_an_administrators_lock_ends_live_sessions_and_outlasts_failed_sign_ins(staff, make_user):
    """A lock an administrator sets (Account lockouts → "Locked by an administrator") is deliberate: it ends the
    account's live sessions too. Failed sign-ins that follow do not shorten it to their 15 minutes."""
    from datetime import timedelta

    from django.utils import timezone

    from yuzu.admin import ACCOUNT_LOCKED_BY_ADMIN

    user, device = staff
    victim = Client()
    assert login(victim, code(device)).status_code == 302
    root = make_user("root", "Administrator", superuser=True, password="root-password-1")
    root_device = TOTPDevice.objects.create(user=root, name="phone", confirmed=True)
    c = Client()
    assert login(c, code(root_device), username="root", password="root-password-1").status_code == 302
    until = timezone.now() + timedelta(days=30)
    r = c.post("/admin/yuzu/accountlockout/add/", {"user": user.pk, "failed_attempts": 0, "manual": "on",
                                                   "locked_until_0": f"{until:%Y-%m-%d}",
                                                   "locked_until_1": f"{until:%H:%M:%S}"})
    assert r.status_code == 302, errors(r)
    assert victim.get("/admin/").status_code == 302  # signed out
    assert victim.get("/api/v1/tokens").status_code == 401
    lock = AccountLockout.objects.get(user=user)
    assert errors(login(Client(), next_code(device))) == [ACCOUNT_LOCKED_BY_ADMIN.format(until=lock.locked_until)]
    for _ in range(6):
        login(Client(), "000000", password="wrong")
    lock.refresh_from_db()
    assert lock.manual and lock.locked_until > timezone.now() + timedelta(days=29)
    # once it has run out, failed sign-ins lock the account again as anyone's do: new sign-ins only
    AccountLockout.objects.filter(pk=lock.pk).update(locked_until=timezone.now(), failed_attempts=0)
    fresh = Client()
    assert login(fresh, next_code(device)).status_code == 302
    for _ in range(5):
        login(Client(), "000000", password="wrong")
    assert AccountLockout.objects.get(pk=lock.pk).is_locked()
    assert fresh.get("/admin/").status_code == 200
