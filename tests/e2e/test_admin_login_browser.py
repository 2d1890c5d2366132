"""The admin login in a real browser (Debian's chromium via Playwright, against a real daphne): an account with
one authenticator logs in with password + code in ONE submission; a code used twice is called an already used
authenticator code, and the page never speaks of "tokens".

The login page's screenshot is written to the test's tmp dir; with YUZU_DOCS_SCREENSHOTS=1 it is also written
to docs/img/admin-login.png (a fixed viewport and an empty form, so it only changes when the page does), and the
enrol page with its QR code to docs/img/admin-enrol.png (a test device's throwaway secret, new on each run)."""

import os
from base64 import b32encode

import pytest
from django.contrib.auth import get_user_model

from tests.support.browser import (
    admin_login,
    chromium,
    off_thread,
    open_page,
    require_browser,
    staff_with_authenticator,
)
from tests.support.otp import code, next_code
from yuzu.admin import CODE_REUSED
from yuzu.models import AuditEvent, TOTPDevice
from yuzu.testing import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

PASSWORD = "approver-password-1"
VIEWPORT = {"width": 900, "height": 640}


def test_one_submission_logs_in_and_a_reused_code_is_named_so(daphne, make_user, tmp_path):
    require_browser()  # fails before any set-up when chromium is missing
    carol = make_user("carol", "Approver", password=PASSWORD)
    get_user_model().objects.filter(pk=carol.pk).update(is_staff=True)
    device = TOTPDevice.objects.create(user=carol, name="phone", confirmed=True)
    server = daphne()

    with chromium() as browser:
        page = open_page(browser, server.base, VIEWPORT)
        posts = []
        page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)

        page.goto("/admin/login/?next=/admin/")
        assert page.inner_text("label[for=id_otp_token]") == "Authenticator code:"
        assert page.locator("#id_otp_device").count() == 0  # one device: nothing to choose
        assert "token" not in page.inner_text("#content").lower()
        page.screenshot(path=str(tmp_path / "admin-login.png"))
        if os.environ.get("YUZU_DOCS_SCREENSHOTS") == "1":
            page.screenshot(path=str(ROOT / "docs" / "img" / "admin-login.png"))

        used = code(device)
        page.fill("#id_username", "carol")
        page.fill("#id_password", PASSWORD)
        page.fill("#id_otp_token", used)
        page.click("input[type=submit][value='Log in']")
        page.wait_for_url(f"{server.base}/admin/")
        assert [u.removeprefix(server.base) for u in posts] == ["/admin/login/?next=/admin/"]  # one submission
        assert "yuzu administration" in page.inner_text("#site-name")

        # A second browser signs in with the very same code: it is named as already used.
        other = open_page(browser, server.base, VIEWPORT)
        other.goto("/admin/login/?next=/admin/")
        other.fill("#id_username", "carol")
        other.fill("#id_password", PASSWORD)
        other.fill("#id_otp_token", used)
        other.click("input[type=submit][value='Log in']")
        other.wait_for_selector("#login-error")
        assert other.inner_text("#login-error") == CODE_REUSED
        assert other.input_value("#id_password") == ""  # the password is not sent back into the page
        assert other.url.startswith(f"{server.base}/admin/login/")

    logins = off_thread(lambda: list(AuditEvent.objects.filter(action="auth.login", principal="carol")
                                     .values_list("result", flat=True)))
    assert logins == ["success"]


def test_an_added_authenticator_is_shown_to_its_user_only(daphne, make_user):
    """The superuser adds an authenticator for nina and never sees its secret (django-otp's page showed it, and
    a QR code of it); nina sets it up at /admin/enrol/ with her password, scans it, confirms it and signs in."""
    require_browser()  # fails before any set-up when chromium is missing
    root = staff_with_authenticator(make_user, "root", None, PASSWORD)
    get_user_model().objects.filter(username="root").update(is_superuser=True)
    nina = make_user("nina", password="nina-password-1")
    get_user_model().objects.filter(pk=nina.pk).update(is_staff=True)
    server = daphne()

    with chromium() as browser:
        page = open_page(browser, server.base, VIEWPORT)
        admin_login(page, server.base, "/admin/yuzu/totpdevice/add/", "root", PASSWORD, root)
        assert page.locator("[name^=key]").count() == 0
        page.select_option("#id_user", label="nina")
        page.fill("#id_name", "nina's phone")
        page.click("input[name=_save]")
        page.wait_for_url(f"{server.base}/admin/yuzu/totpdevice/")
        device = off_thread(lambda: TOTPDevice.objects.get(user__username="nina"))
        assert not device.confirmed
        page.click("text=nina's phone")
        page.wait_for_selector("#content-main")
        seed = off_thread(lambda: device.bin_key)  # unsealed with the KEK, which the test process holds too
        secret = b32encode(seed).decode()
        assert seed.hex() not in page.content() and secret not in page.content()

        nina_page = open_page(browser.new_context(base_url=server.base, viewport=VIEWPORT))
        nina_page.goto("/admin/enrol/")
        nina_page.fill("#id_username", "nina")
        nina_page.fill("#id_password", "nina-password-1")
        nina_page.click("input[type=submit][value=Continue]")
        uri = nina_page.inner_text("#enrol-uri")
        assert uri.startswith("otpauth://totp/yuzu%3Anina?") and f"secret={secret}" in uri
        assert nina_page.locator("#enrol-qr").evaluate("img => img.naturalWidth > 0")
        # The whole address is on the page to copy or read, wrapped inside the form rather than cut off at its edge.
        assert nina_page.locator("#enrol-uri").evaluate(
            "c => c.getBoundingClientRect().right <= c.closest('#content-main').getBoundingClientRect().right")
        if os.environ.get("YUZU_DOCS_SCREENSHOTS") == "1":
            nina_page.screenshot(path=str(ROOT / "docs" / "img" / "admin-enrol.png"), full_page=True)
        nina_page.fill("#id_otp_token", off_thread(lambda: code(device)))
        nina_page.click("input[type=submit][value=Confirm]")
        nina_page.wait_for_url(f"{server.base}/admin/login/")
        assert off_thread(lambda: TOTPDevice.objects.get(pk=device.pk).confirmed)
        nina_page.fill("#id_username", "nina")
        nina_page.fill("#id_password", "nina-password-1")
        nina_page.fill("#id_otp_token", off_thread(lambda: next_code(TOTPDevice.objects.get(pk=device.pk))))
        nina_page.click("input[type=submit][value='Log in']")
        nina_page.wait_for_url(f"{server.base}/admin/")
