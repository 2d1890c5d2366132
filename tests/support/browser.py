"""Debian's chromium for the browser tests, signing in to the admin (in it, or with Django's test client), and a
minimal MCP client over real HTTP."""

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest
from django.db import connections

CHROMIUM = "/usr/bin/chromium"


CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


class McpHttp:
    """Just enough of an MCP client over real HTTP: initialize, then tools/call."""

    def __init__(self, server, token):
        self.url = server.mcp
        self.http = httpx.Client(timeout=30, headers={"authorization": f"Bearer {token}",
                                                      "accept": "application/json, text/event-stream"})
        r = self.http.post(self.url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                           "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                                      "clientInfo": {"name": "browser-test", "version": "0"}}})
        assert r.status_code == 200, r.text
        self.http.headers.update({"mcp-session-id": r.headers["mcp-session-id"],
                                  "mcp-protocol-version": "2025-11-25"})
        self.next_id = 1

    def call(self, name, arguments):
        self.next_id += 1
        r = self.http.post(self.url, json={"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
                                           "params": {"name": name, "arguments": arguments}})
        assert r.status_code == 200, r.text
        return r.json()


def off_thread(fn, *args):
    """ORM work while the browser is open: the Playwright sync API keeps an event loop on this thread,
    so run it on a plain worker thread (and close that thread's connection)."""

    def run():
        try:
            return fn(*args)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def require_browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium; "
                    "`make test` does it through tests/support/system_deps.py). This test does not skip.")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the playwright package is missing: pip install -r requirements-test.txt")
    return sync_playwright


@contextmanager
def chromium():
    """Debian's chromium, headless, for one test: the browser, closed at the end however the test ends."""
    sync_playwright = require_browser()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser, base_url=None, viewport=None, timeout=15000):
    """A new page of ``browser`` (or of a context of it) on ``base_url``, waiting at most ``timeout`` ms a step."""
    options = {k: v for k, v in (("base_url", base_url), ("viewport", viewport)) if v}
    page = browser.new_page(**options)
    page.set_default_timeout(timeout)
    return page


def staff_with_authenticator(make_user, username, role, password, *, group=None, superuser=False):
    """A staff user holding ``role`` (on ``group``), with a confirmed TOTP device (the admin's second factor)."""
    from django.contrib.auth import get_user_model

    from yuzu.models import TOTPDevice

    user = make_user(username, role, group=group, superuser=superuser, password=password)
    get_user_model().objects.filter(pk=user.pk).update(is_staff=True)
    return TOTPDevice.objects.create(user=user, name="phone", confirmed=True)


def staff_client(make_user, username, role=None, group=None, superuser=False, password="pw-long-enough-1"):
    """A Django test client signed in to the admin (password + authenticator code) as a staff user holding ``role``;
    ``.device`` is its authenticator."""
    from django.test import Client

    from .otp import code

    device = staff_with_authenticator(make_user, username, role, password, group=group, superuser=superuser)
    c = Client(raise_request_exception=False)
    r = c.post("/admin/login/?next=/admin/", {"username": username, "password": password, "otp_token": code(device)})
    assert r.status_code == 302, r.content[:500]
    c.device = device
    return c


def admin_login(page, base, next_path, username, password, device):
    """Sign in on the admin's login page (password and authenticator code) and land on ``next_path``."""
    from .otp import code

    page.goto(f"/admin/login/?next={next_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.fill("#id_otp_token", code(device))
    page.click("input[type=submit][value='Log in']")
    page.wait_for_url(f"{base}{next_path}")
