"""The admin login in a real browser (Debian's chromium via Playwright, against a real daphne): an account with
one authenticator logs in with password + code in ONE submission; a code used twice is called an already used
authenticator code, and the page never speaks of "tokens".

The login page's screenshot is written to the test's tmp dir; with YUZU_DOCS_SCREENSHOTS=1 it is also written
to docs/img/admin-login.png (a fixed viewport and an empty form, so it only changes when the page does)."""

import os

import pytest
from django.contrib.auth import get_user_model
from django_otp.plugins.otp_totp.models import TOTPDevice

from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, off_thread, require_browser
from tests.support.otp import code
from yuzu.admin import CODE_REUSED
from yuzu.models import AuditEvent
from yuzu.testing import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

PASSWORD = "approver-password-1"
VIEWPORT = {"width": 900, "height": 640}


def test_one_submission_logs_in_and_a_reused_code_is_named_so(daphne, make_user, tmp_path):
    sync_playwright = require_browser()
    carol = make_user("carol", "Approver", password=PASSWORD)
    get_user_model().objects.filter(pk=carol.pk).update(is_staff=True)
    device = TOTPDevice.objects.create(user=carol, name="phone", confirmed=True)
    server = daphne()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(base_url=server.base, viewport=VIEWPORT)
            page.set_default_timeout(15000)
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
            other = browser.new_page(base_url=server.base, viewport=VIEWPORT)
            other.set_default_timeout(15000)
            other.goto("/admin/login/?next=/admin/")
            other.fill("#id_username", "carol")
            other.fill("#id_password", PASSWORD)
            other.fill("#id_otp_token", used)
            other.click("input[type=submit][value='Log in']")
            other.wait_for_selector("#login-error")
            assert other.inner_text("#login-error") == CODE_REUSED
            assert other.input_value("#id_password") == ""  # the password is not sent back into the page
            assert other.url.startswith(f"{server.base}/admin/login/")
        finally:
            browser.close()

    logins = off_thread(lambda: list(AuditEvent.objects.filter(action="auth.login", principal="carol")
                                     .values_list("result", flat=True)))
    assert logins == ["success"]
