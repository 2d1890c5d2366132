"""The official MCP Python SDK (`mcp` 2.3.0, OAuthClientProvider) connects through OAuth, end to end, with a
headless Chromium for the person:

1. Against `manage.py serve` (what `make run` runs: daphne, the background workers, the local agent), a client
   identified by its client ID metadata document (served over HTTPS by tests/support/metadata_server.py): the SDK gets a
   401 pointing at the protected resource metadata, discovers the authorization server, opens the authorization
   URL; the browser signs alice in (password + authenticator code, one submission) and approves the consent page;
   the SDK exchanges the code, lists the tools, asks to run os.info on the local agent, gets -32006 with a ticket;
   the administrator approves it in the admin; the SDK's recall runs on the agent and the answer comes back; the
   access token is then refreshed under the same MCP session.
2. Against daphne, a client that registers dynamically (RFC 7591), is granted readonly, calls a tool that needs
   operator, gets 403 insufficient_scope, and steps up through a second consent; the retry goes through in the
   same session.
"""

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
from django.contrib.auth import get_user_model

from approvals.models import Approval
from fleet.models import Agent
from oauth.models import Authorization
from tests.support.browser import chromium, off_thread, require_browser
from tests.support.metadata_server import MetadataServer
from tests.support.otp import code
from yuzu.models import ApiToken, AuditEvent, TOTPDevice
from yuzu.rbac import assign_role
from yuzu.testing import ROOT, free_port, server_env, spawn, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

SDK_PY = ROOT / ".venv-mcp" / "bin" / "python"
DRIVER = ROOT / "tests" / "mcp_client" / "oauth_drive.py"
CLIENT_NAME = "yuzu e2e (official MCP SDK)"


def person(username, role=None, superuser=False):
    """A staff account with a password and one authenticator, as an administrator would set it up."""
    User = get_user_model()
    user = (User.objects.create_superuser(username, "", f"{username}-password-1") if superuser
            else User.objects.create_user(username, password=f"{username}-password-1", is_staff=True))
    if role:
        assign_role(user, role)
    return user, TOTPDevice.objects.create(user=user, name="phone", confirmed=True)


class Serve:
    """`manage.py serve` on a free port, on the test database, with its own var/."""

    def __init__(self, tmp_path, **env):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = server_env(YUZU_BIND=f"127.0.0.1:{self.port}", YUZU_VAR_DIR=str(tmp_path / "var"), **env)
        self.proc = spawn("serve", [sys.executable, "manage.py", "serve"], env, tmp_path)
        wait_until(self.healthy, 60, what="serve to answer /healthz")

    def healthy(self):
        if self.proc.proc.poll() is not None:
            pytest.fail(f"serve exited: {self.proc.log()}")
        try:
            return httpx.get(self.base + "/healthz", timeout=1, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self):
        self.proc.proc.terminate()  # serve stops everything it started
        try:
            self.proc.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.proc.kill()


class Sdk:
    """The driver script in the SDK's environment; the browser hand-off goes through files in ``dir``."""

    def __init__(self, tmp_path, url, steps, params, **options):
        self.dir = tmp_path / "sdk"
        self.dir.mkdir()
        self.callback = f"http://127.0.0.1:{free_port()}/callback"
        argv = [str(SDK_PY), str(DRIVER), "--url", url, "--dir", str(self.dir), "--redirect-uri", self.callback,
                "--steps", json.dumps(steps)] + [f"--param={k}={v}" for k, v in params.items()]
        for name, value in options.items():
            argv += [f"--{name.replace('_', '-')}", value]
        self.log = open(tmp_path / "sdk.err", "w")
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=self.log, text=True)

    def authorization_url(self, n, timeout=90):
        path = self.dir / f"authorize-{n}.url"
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None:
                pytest.fail(f"the SDK ended before asking for authorization {n}: {self.proc.stdout.read()}")
            if time.monotonic() > deadline:
                pytest.fail(f"the SDK asked for no authorization {n} in {timeout} s")
            time.sleep(0.1)
        return path.read_text()

    def deliver(self, n, url):
        tmp = self.dir / f"callback-{n}.url.tmp"
        tmp.write_text(url)
        tmp.rename(self.dir / f"callback-{n}.url")

    def result(self, timeout=240):
        out, _ = self.proc.communicate(timeout=timeout)
        self.log.close()
        obs = json.loads(out)
        assert "fatal" not in obs, obs["fatal"]
        return obs


class Person:
    """One browser page: signs in when asked, consents at a tier, hands the redirect back to the SDK."""

    def __init__(self, browser, base, callback):
        self.page = browser.new_context(base_url=base, viewport={"width": 1280, "height": 900}).new_page()
        self.page.set_default_timeout(30000)
        self.base, self.callback = base, callback
        self.page.route(callback + "*", lambda route: route.fulfill(
            status=200, content_type="text/plain", body="yuzu connected; you can close this window."))

    def sign_in(self, username, device, shot=None):
        page = self.page
        assert page.locator("#oauth-login-note").count() == 1  # the admin's login, saying why
        page.fill("#id_username", username)
        page.fill("#id_password", f"{username}-password-1")
        page.fill("#id_otp_token", off_thread(code, device))
        shoot(page, shot)
        page.click("input[type=submit][value='Log in']")

    def consent(self, tier, days="30", shot=None):
        page = self.page
        page.wait_for_selector("#consent-form")
        facts = {"client": page.inner_text("#client-name"), "endpoint": page.inner_text("#endpoint"),
                 "how": page.inner_text("#client-facts"),
                 "user": page.inner_text("#consent-user"), "asked": page.inner_text("#tier-asked"),
                 "tiers": page.locator("input[name=tier]").evaluate_all("els => els.map(e => e.value)")}
        shoot(page, shot)
        page.check(f"input[name=tier][value={tier}]")
        page.fill("#id_days", days)
        page.click("#approve-button")
        page.wait_for_url(self.callback + "?*")  # the client's redirect URI (answered by the route above)
        return facts, page.url


def shoot(page, name):
    """With YUZU_DOCS_SCREENSHOTS=1, the pages docs/mcp.md shows (docs/img/, like test_first_approval_browser)."""
    if name and os.environ.get("YUZU_DOCS_SCREENSHOTS") == "1":
        page.screenshot(path=str(ROOT / "docs" / "img" / name), full_page=True)


GATED = {"plugin": "os", "action": "info", "agent_ids": ["$agent_id"]}
STEPS = [
    {"op": "list", "kind": "tools"},
    {"op": "call", "tool": "execute_instruction", "as": "gated", "args": GATED},
    {"op": "wait_for_file", "path": "$approved", "timeout": 300},
    {"op": "call", "tool": "execute_instruction", "as": "execute",
     "args": {**GATED, "approval_id": "@calls.gated.error.data.approval_id"}},
    {"op": "poll", "tool": "get_execution_status", "as": "status", "timeout": 60,
     "args": {"execution_id": "@calls.execute.structured.execution_id"},
     "until": {"field": "status", "in": ["succeeded", "completed", "cancelled", "failed"]}},
    {"op": "call", "tool": "query_responses", "as": "responses",
     "args": {"execution_id": "@calls.execute.structured.execution_id"}},
    {"op": "expire_token"},
    {"op": "call", "tool": "list_api_tokens", "as": "after_refresh"},
]


def test_official_client_oauth_with_a_metadata_document_against_serve(tmp_path):
    require_browser()  # fails before any set-up when chromium is missing
    _, alice_device = person("alice", "Operator")
    _, root_device = person("root", superuser=True)
    sdk_dir = tmp_path / "md"
    sdk_dir.mkdir()
    documents = MetadataServer(sdk_dir, {})
    serve = None
    try:
        serve = Serve(tmp_path, SSL_CERT_FILE=documents.ca_file, YUZU_OAUTH_CIMD_ALLOWED_NETWORKS="127.0.0.0/8")
        agent = wait_until(lambda: Agent.objects.filter(connected=True).first(), 90,
                           what="serve's local agent to connect")
        approved = tmp_path / "approved"
        metadata_url = documents.url("client.json")
        sdk = Sdk(tmp_path, serve.base + "/mcp/v1/", STEPS, {"agent_id": agent.pk, "approved": approved},
                  client_metadata_url=metadata_url)
        documents.documents["client"] = {"client_name": CLIENT_NAME, "redirect_uris": [sdk.callback],
                                         "grant_types": ["authorization_code", "refresh_token"],
                                         "token_endpoint_auth_method": "none"}
        url = sdk.authorization_url(1)
        assert url.startswith(serve.base + "/oauth/authorize?")

        with chromium() as browser:
            alice = Person(browser, serve.base, sdk.callback)
            alice.page.goto(url)
            alice.page.wait_for_url(f"{serve.base}/admin/login/?next=**")
            alice.sign_in("alice", alice_device, shot="oauth-login.png")
            facts, redirect = alice.consent("supervised", shot="oauth-consent.png")
            assert facts["client"] == CLIENT_NAME and facts["endpoint"] == "/mcp/v1/" and facts["user"] == "alice"
            assert facts["tiers"] == ["readonly", "operator", "supervised"]
            sdk.deliver(1, redirect)

            # The gated call made a ticket; the administrator approves it in the admin.
            tid = wait_until(lambda: off_thread(lambda: Approval.objects.filter(
                status="pending", submitted_by="alice").values_list("pk", flat=True).first()), 90,
                what="alice's call to wait for an approval")
            admin = Person(browser, serve.base, sdk.callback).page
            admin.goto("/admin/login/?next=/admin/")
            admin.fill("#id_username", "root")
            admin.fill("#id_password", "root-password-1")
            admin.fill("#id_otp_token", off_thread(code, root_device))
            admin.click("input[type=submit][value='Log in']")
            admin.wait_for_url(f"{serve.base}/admin/")
            admin.goto(f"/admin/approvals/approval/{tid}/review/")
            assert admin.inner_text("#ticket-submitter") == "alice"
            assert "(supervised tier)" in admin.inner_text("#ticket-token")
            admin.click("#approve-button")
            admin.wait_for_url(f"{serve.base}/admin/approvals/approval/")
            approved.touch()
            obs = sdk.result()

            # What the administrator sees afterwards: the client and alice's connection.
            admin.goto("/admin/oauth2_provider/application/")
            assert CLIENT_NAME in admin.inner_text("#result_list") and "active" in admin.inner_text("#result_list")
            admin.goto("/admin/oauth/authorization/")
            assert "alice" in admin.inner_text("#result_list")
    finally:
        if serve is not None:
            serve.stop()
        documents.close()

    # The OAuth dance as the SDK saw it: 401 → metadata → (no registration: the document is the client) → token.
    http = obs["http"]
    first = http[0]
    assert (first["path"], first["status"], first["bearer"]) == ("/mcp/v1/", 401, False)
    assert 'resource_metadata="' + serve.base + '/.well-known/oauth-protected-resource/mcp/v1"' in \
        first["www_authenticate"]
    paths = [(h["method"], h["path"], h["status"]) for h in http]
    assert ("GET", "/.well-known/oauth-protected-resource/mcp/v1", 200) in paths
    assert ("GET", "/.well-known/oauth-authorization-server", 200) in paths
    assert not any(p == "/oauth/register" for _, p, _ in paths)
    assert [s for m, p, s in paths if p == "/oauth/token"] == [200, 200]  # the code, then the refresh
    assert all(h["bearer"] for h in http if h["path"].startswith("/mcp/") and h is not first)
    assert obs["client_id"] == metadata_url and obs["authorizations"] == 1

    # The tools, the approval flow, the recall on the real agent, and the refreshed token in the same session.
    assert "execute_instruction" in obs["lists"]["tools"]["names"]
    assert obs["calls"]["gated"]["error"]["code"] == -32006
    assert obs["calls"]["execute"]["structured"]["execution_id"]
    assert obs["calls"]["status"]["reached"], obs["calls"]["status"]
    rows = obs["calls"]["responses"]["structured"]["responses"]
    assert [r["status"] for r in rows] == ["SUCCESS"]
    first_token, refreshed = obs["tokens"]
    assert first_token["scope"] == refreshed["scope"] == "mcp:supervised"
    assert first_token["access"] != refreshed["access"] and first_token["refresh"] != refreshed["refresh"]
    assert first_token["access_prefix"] == "yuzu_"
    listed = obs["calls"]["after_refresh"]["structured"]["tokens"]
    assert [t["name"] for t in listed if "(OAuth" in t["name"]] == [f"{CLIENT_NAME} (OAuth, /mcp/v1/, until "
                                                                    f"{Authorization.objects.get().expires_at:%Y-%m-%d})"]

    # What the server holds: one connection, its API token (alice's, supervised, bound to /mcp/v1), the audit.
    token = ApiToken.objects.get(audience="mcp-v1")
    assert (token.owner.username, token.mcp_tier, token.revoked_at) == ("alice", "supervised", None)
    ticket = Approval.objects.get()
    assert (ticket.status, ticket.submitted_by, ticket.reviewed_by, ticket.consumed_by) == \
        ("approved", "alice", "root", "alice")
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"oauth.client.register", "oauth.consent", "api_token.create", "oauth.token.refresh",
            "approval.approve"} <= actions
    assert AuditEvent.objects.get(action="oauth.client.register").target_id == metadata_url


def test_official_client_registers_dynamically_and_steps_up(daphne, tmp_path):
    require_browser()  # fails before any set-up when chromium is missing
    _, device = person("alice", "Operator")
    server = daphne()
    steps = [{"op": "list", "kind": "tools"},
             {"op": "call", "tool": "set_tag", "as": "stepped_up", "args": {"agent_id": "nope", "key": "k", "value": "v"}},
             {"op": "list", "kind": "tools", "as": "tools_after"}]
    sdk = Sdk(tmp_path, server.mcp, steps, {})
    with chromium() as browser:
        alice = Person(browser, server.base, sdk.callback)
        alice.page.goto(sdk.authorization_url(1))
        alice.sign_in("alice", device)
        facts, redirect = alice.consent("readonly")
        assert facts["client"] == CLIENT_NAME and "registered itself" in facts["how"]
        sdk.deliver(1, redirect)
        # set_tag needs operator: 403 insufficient_scope, the SDK re-authorizes; alice is still signed in.
        alice.page.goto(sdk.authorization_url(2))
        facts, redirect = alice.consent("operator")
        sdk.deliver(2, redirect)
        obs = sdk.result()

    paths = [(h["method"], h["path"], h["status"]) for h in obs["http"]]
    assert ("POST", "/oauth/register", 201) in paths
    step_up = next(h for h in obs["http"] if h["status"] == 403)
    assert 'error="insufficient_scope", scope="mcp:operator"' in step_up["www_authenticate"]
    assert [t["scope"] for t in obs["tokens"]] == ["mcp:readonly", "mcp:operator"]
    assert "set_tag" not in obs["lists"]["tools"]["names"] and "set_tag" in obs["lists"]["tools_after"]["names"]
    call = obs["calls"]["stepped_up"]
    assert call.get("error", {}).get("code") != -32004, call  # past the tier: the tool itself answers
    assert obs["authorizations"] == 2
    # One connection, one token row: the step-up took it over, so the MCP session carried on.
    assert ApiToken.objects.filter(audience="mcp-v1").count() == 1
    assert not any(s == 404 for _, p, s in paths if p.startswith("/mcp/"))
