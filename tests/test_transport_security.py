"""The transport's guards against a real daphne (issue 10): what another site's page can do with an admin's
session cookie, and test-only switches that must not exist in production."""

import json
import re
import subprocess
import sys

import httpx
import pytest
from django.contrib.auth import get_user_model
from django_otp.plugins.otp_totp.models import TOTPDevice

from fleet.models import Agent, Tag
from yuzu.rbac import seed_builtin_roles

from .conftest import ROOT, free_port, server_env
from .otp import code

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

PASSWORD = "admin-password-1"
VERSION = "2025-11-25"


def admin_session_cookie(server, username, device):
    """Log in through the admin's own form (password + TOTP), as a person would: the OTP-verified session
    cookie the browser then holds."""
    with httpx.Client(base_url=server.base, timeout=15) as http:
        page = http.get("/admin/login/?next=/admin/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        r = http.post("/admin/login/?next=/admin/", data={
            "csrfmiddlewaretoken": csrf, "username": username, "password": PASSWORD,
            "otp_device": device.persistent_id, "otp_token": code(device), "next": "/admin/"})
        assert r.status_code == 302 and r.headers["location"] == "/admin/", r.text[-2000:]
        return http.cookies["sessionid"]


def tool_call(name, arguments, rid=1):
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


PWN = tool_call("set_tag", {"agent_id": "host-1", "key": "pwned", "value": "yes"})


@pytest.mark.parametrize("streaming", ["on", "off"])
def test_a_cross_origin_page_cannot_use_the_admin_cookie(daphne, make_user, streaming):
    seed_builtin_roles()
    Agent.objects.create(agent_id="host-1", hostname="host-1")
    admin = make_user("root", "Administrator", password=PASSWORD)
    get_user_model().objects.filter(pk=admin.pk).update(is_staff=True)
    device = TOTPDevice.objects.create(user=admin, name="phone", confirmed=True)
    server = daphne(**({"YUZU_MCP_NO_STREAMING": "1"} if streaming == "off" else {}))
    cookie = {"cookie": f"sessionid={admin_session_cookie(server, 'root', device)}"}
    # A page on another port of the same host: the browser treats it as the same site, so its fetch(…,
    # {credentials: "include"}) carries the admin's Lax cookie. A text/plain body needs no CORS preflight.
    evil = f"http://127.0.0.1:{free_port()}"

    def post(body, **headers):
        return httpx.post(server.mcp, content=json.dumps(body), headers={**cookie, **headers}, timeout=15)

    r = post(PWN, origin=evil, **{"content-type": "text/plain;charset=UTF-8"})
    assert r.status_code == 403 and r.json()["error"]["code"] == -32008, r.text
    r = post(PWN, origin=evil, **{"content-type": "application/json"})  # a preflight would stop a browser first
    assert r.status_code == 403 and r.json()["error"]["code"] == -32008, r.text
    r = post(PWN, **{"content-type": "text/plain"})  # a client that sends no Origin still cannot send text
    assert r.status_code == 415 and r.json()["error"]["code"] == -32600, r.text
    r = post(PWN, **{"content-type": "application/x-www-form-urlencoded"})  # an HTML form
    assert r.status_code == 415, r.text
    assert not Tag.objects.filter(key="pwned").exists()

    # Behind those two checks the cookie still works: same origin, application/json.
    same = {"origin": server.base, "content-type": "application/json; charset=utf-8", "accept": "application/json"}
    headers = dict(same)
    if streaming == "on":
        init = post({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                     "params": {"protocolVersion": VERSION, "capabilities": {},
                                "clientInfo": {"name": "admin-page", "version": "0"}}}, **same)
        assert init.status_code == 200, init.text
        headers.update({"mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": VERSION})
    r = post(tool_call("set_tag", {"agent_id": "host-1", "key": "owner", "value": "ops"}), **headers)
    assert r.status_code == 200 and "error" not in r.json(), r.text
    assert Tag.objects.get(agent_id="host-1", key="owner").value == "ops"


def test_the_removed_anonymous_switch_refuses_to_start(tmp_path):
    """YUZU_MCP_TEST_ANONYMOUS_USER used to turn unauthenticated calls into a Viewer. Set on a server now,
    daphne refuses to start instead of serving."""
    port = free_port()
    proc = subprocess.run([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "yuzu.asgi:application"],
                          cwd=ROOT, env=server_env(YUZU_MCP_TEST_ANONYMOUS_USER="viewer"), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    assert "YUZU_MCP_TEST_ANONYMOUS_USER is no longer supported" in proc.stderr
