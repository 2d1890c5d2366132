"""Admin login needs password + TOTP; step-up refreshes the MFA proof; health, readiness, metrics."""

import time

import pytest
from django.test import Client
from django_otp.plugins.otp_totp.models import TOTPDevice

from yuzu.auth import MFA_SESSION_KEY

from .otp import code, next_code

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(make_user):
    user = make_user("boss", "Administrator", superuser=True, password="s3cret-password")
    return user, TOTPDevice.objects.create(user=user, name="phone", confirmed=True)


def test_admin_login_requires_otp(staff):
    user, device = staff
    c = Client()
    r = c.post("/admin/login/?next=/admin/", {"username": "boss", "password": "s3cret-password"})
    assert r.status_code == 200 and c.get("/admin/").status_code == 302  # still logged out
    r = c.post("/admin/login/?next=/admin/", {"username": "boss", "password": "s3cret-password", "otp_token": "000000"})
    assert c.get("/admin/").status_code == 302
    r = c.post("/admin/login/?next=/admin/", {"username": "boss", "password": "s3cret-password",
                                              "otp_device": device.persistent_id, "otp_token": code(device)})
    assert r.status_code == 302
    assert c.get("/admin/").status_code == 200
    assert c.session.get(MFA_SESSION_KEY) is not None


def test_lockout_after_failed_logins(staff):
    c = Client()
    for _ in range(5):
        c.post("/admin/login/", {"username": "boss", "password": "wrong", "otp_token": "000000"})
    _, device = staff
    r = c.post("/admin/login/?next=/admin/", {"username": "boss", "password": "s3cret-password",
                                              "otp_device": device.persistent_id, "otp_token": code(device)})
    assert c.get("/admin/").status_code == 302  # locked out even with the right password and code
    assert r.status_code == 200


def test_stepup_refreshes_proof(staff):
    user, device = staff
    c = Client()
    c.post("/admin/login/", {"username": "boss", "password": "s3cret-password", "otp_device": device.persistent_id,
                             "otp_token": code(device)})
    s = c.session
    s[MFA_SESSION_KEY] = time.time() - 3600
    s.save()
    r = c.post("/admin/stepup/", {"otp_token": "123", "next": "/admin/"})
    assert r.status_code == 200 and c.session[MFA_SESSION_KEY] < time.time() - 3000
    r = c.post("/admin/stepup/", {"otp_token": next_code(device), "next": "/admin/"})
    assert r.status_code == 302 and c.session[MFA_SESSION_KEY] > time.time() - 5


def test_session_cookie_authenticates_rest_only_when_verified(staff):
    user, device = staff
    c = Client()
    c.force_login(user)  # password-only session: not OTP-verified
    assert c.get("/api/v1/tokens").status_code == 401
    c = Client()
    c.post("/admin/login/", {"username": "boss", "password": "s3cret-password", "otp_device": device.persistent_id,
                             "otp_token": code(device)})
    assert c.get("/api/v1/tokens").status_code == 200


def test_health_ready_metrics():
    c = Client()
    assert c.get("/healthz").json() == {"status": "ok"}
    ready = c.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["database"] == "ok"
    m = c.get("/metrics")
    assert m.status_code == 200 and b"yuzu_http_requests_total" in m.content


def test_admin_static_files_are_served_by_the_asgi_app():
    from asgiref.sync import async_to_sync

    from yuzu.asgi import application

    from .sse_client import Stream

    async def fetch(path):
        s = await Stream(application, "GET", path, {"host": "127.0.0.1:8000"}).open()
        return s.status, await s.read_body()

    status, body = async_to_sync(fetch)("/static/admin/css/base.css")
    assert status == 200 and "body" in body
    assert async_to_sync(fetch)("/static/admin/css/nope.css")[0] == 404
