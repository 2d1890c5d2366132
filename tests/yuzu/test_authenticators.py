"""An authenticator's secret is its user's alone: the superuser's admin never shows or returns it (the change form,
the list, its filters and search, the history, a QR code page), so an approval's code proves *that* approver. An
administrator adds an authenticator for a user without seeing it; the user sets it up at /admin/enrol/ with their
own password, seeing the secret once, and confirms it with a code."""

import re
import time
from base64 import b32encode

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from tests.support.browser import staff_client
from tests.support.otp import next_code
from yuzu.auth import MFA_SESSION_KEY
from yuzu.models import AccountLockout, AuditEvent, TOTPDevice

pytestmark = pytest.mark.django_db

PASSWORD = "pw-long-enough-1"
LIST = "/admin/yuzu/totpdevice/"


def secrets_of(device):
    """Every spelling of the device's secret a page could carry: hex, base32 (the otpauth URI)."""
    return [device.bin_key.hex(), b32encode(device.bin_key).decode(), b32encode(device.bin_key).decode().rstrip("=")]


def shows_secret(response, device):
    body = response.content.decode(errors="replace")
    return any(s in body for s in secrets_of(device))


def test_the_superuser_never_sees_an_approvers_authenticator_secret(make_user):
    root = staff_client(make_user, "root", superuser=True)
    alice = make_user("alice", "Approver", password="alice-password-1")
    device = TOTPDevice.objects.create(user=alice, name="alice's phone", confirmed=True)
    change = f"{LIST}{device.pk}/change/"
    # every page the superuser can reach about it
    for url in (LIST, f"{LIST}?q=alice", change, f"{LIST}add/", f"{LIST}{device.pk}/delete/", "/admin/yuzu/",
                "/admin/"):
        r = root.get(url)
        assert r.status_code == 200, url
        assert not shows_secret(r, device), url
    assert 'name="key' not in root.get(change).content.decode()
    # the change form saves the name, never a secret of the superuser's choosing, and its history shows none
    assert root.post(change, {"name": "alice phone", "key": "00" * 20, "confirmed": "on"}).status_code == 302
    device.refresh_from_db()
    assert device.bin_key != bytes(20) and device.name == "alice phone"
    r = root.get(f"{LIST}{device.pk}/history/")
    assert r.status_code == 200 and "alice phone" in r.content.decode() and not shows_secret(r, device)
    # django-otp's QR code and configuration pages show the secret: they are gone
    for url in (f"{LIST}{device.pk}/config/", f"{LIST}{device.pk}/qrcode/"):
        r = root.get(url)
        assert not shows_secret(r, device) and r.status_code in (302, 404), (url, r.status_code)
    # nor is the secret a filter to read it a character at a time
    for lookup in ("key_sealed__startswith=a", "key_sealed__regex=^a"):
        assert root.get(f"{LIST}?{lookup}").status_code == 400, lookup
    assert root.get(f"{LIST}?confirmed__exact=1").status_code == 200


def test_an_administrator_adds_an_authenticator_its_user_alone_sets_up(make_user):
    root = staff_client(make_user, "root", superuser=True)
    nina = make_user("nina", password="nina-password-1")
    get_user_model().objects.filter(pk=nina.pk).update(is_staff=True)
    r = root.post(f"{LIST}add/", {"user": nina.pk, "name": "nina's phone", "key": "00" * 20, "confirmed": "on"})
    assert r.status_code == 302, r.content[:2000]
    device = TOTPDevice.objects.get(user=nina)
    assert not device.confirmed and device.bin_key != bytes(20)  # made by the server, proven by its user
    assert not shows_secret(root.get(r["Location"]), device)
    assert AuditEvent.objects.filter(action="admin.totpdevice.add", principal="root").count() == 1
    # the superuser's own enrolment page knows nothing of nina's authenticator
    assert not shows_secret(root.get("/admin/enrol/"), device)

    # nina cannot sign in yet; the login says where to set the authenticator up
    n = Client(raise_request_exception=False)
    r = n.post("/admin/login/?next=/admin/", {"username": "nina", "password": "nina-password-1", "otp_token": "1"})
    assert r.status_code == 200 and "/admin/enrol/" in r.content.decode()
    # a wrong password shows nothing, and counts towards the lockout like any failed sign-in
    r = n.post("/admin/enrol/", {"username": "nina", "password": "wrong"})
    assert r.status_code == 200 and not shows_secret(r, device)
    assert AccountLockout.objects.get(user=nina).failed_attempts == 1
    # her password: the secret, once, on her page — under a new session key, so a session id planted in her
    # browser beforehand (session fixation) shows its planter nothing
    planted = n.session.session_key
    r = n.post("/admin/enrol/", {"username": "nina", "password": "nina-password-1"})
    assert r.status_code == 302 and r["Location"] == "/admin/enrol/"
    planter = Client()
    planter.cookies[settings.SESSION_COOKIE_NAME] = planted
    assert not shows_secret(planter.get("/admin/enrol/"), device)
    page = n.get("/admin/enrol/")
    assert page.status_code == 200 and device.config_url in page.content.decode().replace("&amp;", "&")
    assert "data:image/svg+xml;base64," in page.content.decode()  # the QR code
    r = n.post("/admin/enrol/", {"otp_token": "000000"})
    device.refresh_from_db()
    assert r.status_code == 200 and not device.confirmed
    device.throttle_reset()
    r = n.post("/admin/enrol/", {"otp_token": next_code(device)})
    assert r.status_code == 302 and r["Location"].startswith("/admin/login/")
    device.refresh_from_db()
    assert device.confirmed
    assert AuditEvent.objects.filter(action="auth.mfa_enrol", principal="nina", result="success").count() == 1
    assert not shows_secret(n.get("/admin/enrol/"), device)  # shown once: the page is done with it
    r = n.post("/admin/login/?next=/admin/", {"username": "nina", "password": "nina-password-1",
                                              "otp_token": next_code(device)})
    assert r.status_code == 302 and n.get("/admin/").status_code == 200


def test_a_password_alone_never_sets_up_a_second_authenticator(make_user):
    """An account that has a working authenticator adds another only signed in with it (and a fresh code): with
    the password alone a thief would enrol a pending one."""
    c = staff_client(make_user, "bob", role="Approver")
    pending = TOTPDevice.objects.create(user=get_user_model().objects.get(username="bob"), name="new", confirmed=False)
    r = Client().post("/admin/enrol/", {"username": "bob", "password": PASSWORD})
    assert r.status_code == 200 and not shows_secret(r, pending)
    assert "already has an authenticator" in r.content.decode()
    # signed in with the first one, and a fresh proof: the new one is shown to bob
    s = c.session
    s[MFA_SESSION_KEY] = time.time() - 3600
    s.save()
    r = c.get("/admin/enrol/")
    assert r.status_code == 302 and r["Location"].startswith("/admin/stepup/")
    assert c.post("/admin/stepup/", {"otp_token": next_code(c.device), "next": "/admin/enrol/"}).status_code == 302
    assert shows_secret(c.get("/admin/enrol/"), pending)


def test_a_reset_authenticator_is_set_up_again_by_its_user(make_user):
    root = staff_client(make_user, "root", superuser=True)
    alice = make_user("alice", "Approver", password="alice-password-1")
    device = TOTPDevice.objects.create(user=alice, name="phone", confirmed=True)
    old = device.bin_key
    r = root.post(LIST, {"action": "reset", "_selected_action": [device.pk]})
    assert r.status_code == 302
    device.refresh_from_db()
    assert device.bin_key != old and not device.confirmed
    assert not shows_secret(root.get(r["Location"]), device)
    assert AuditEvent.objects.filter(action="admin.totpdevice.reset", target_id=str(device.pk)).count() == 1
    n = Client()
    assert n.post("/admin/enrol/", {"username": "alice", "password": "alice-password-1"}).status_code == 302
    assert shows_secret(n.get("/admin/enrol/"), device)


def test_enrolment_refuses_bad_input_without_a_500(make_user):
    c = Client(raise_request_exception=False)
    assert c.get("/admin/enrol/").status_code == 200
    assert c.post("/admin/enrol/", {"username": "x\x00", "password": "y"}).status_code in (200, 400)
    assert c.post("/admin/enrol/", {"otp_token": "123456"}).status_code == 200  # no step 1: the sign-in form again
    assert re.search(r'name="username"', c.get("/admin/enrol/").content.decode())
