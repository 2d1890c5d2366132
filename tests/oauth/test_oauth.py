"""yuzu as its own OAuth 2.1 authorization server for MCP clients (docs/oauth.md), in-process: discovery, dynamic
registration, the admin-login consent, the authorization code flow with PKCE, resource-bound tokens that ARE API
tokens, refresh rotation with reuse detection, revocation, step-up — and every way of getting it wrong refused with
the right OAuth error and nothing issued. Client metadata documents: tests/oauth/test_oauth_cimd.py; the official client
in a real browser against `serve`: tests/e2e/test_oauth_e2e.py."""

import json
import threading
from datetime import timedelta
from functools import partial

import pytest
from django.test import override_settings
from django.utils import timezone
from oauth2_provider.models import Application, Grant, RefreshToken

from oauth.models import Authorization
from tests.support.mcp_http import McpClient, request
from tests.support.oauth_flow import (
    BASE,
    BRIDGE,
    REDIRECT,
    V1,
    Flow,
    anonymous,
    callback,
    connect,
    refresh,
    register,
    registered,
    signed_in,
    token_request,
)
from tests.support.races import at_once
from yuzu.models import ApiToken, AuditEvent, hash_secret

pytestmark = pytest.mark.django_db(transaction=True)

PRM_V1 = f"{BASE}/.well-known/oauth-protected-resource/mcp/v1"


@pytest.fixture(autouse=True)
def fresh_limits():
    """The registration limits and the metadata-document backoff live in the (per-process) cache."""
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def person(make_user):
    """alice: staff, Operator role (her roles reach the supervised tier), signed in with password + authenticator."""
    def make(username="alice", role="Operator", **kw):
        user = make_user(username, role, password=f"{username}-password-1")
        user.is_staff = True
        user.save()
        return signed_in(user, **kw)
    return make


def audit(action, result=None):
    rows = AuditEvent.objects.filter(action=action).order_by("id")
    return [r for r in rows if result is None or r.result == result]


def issued():
    """What exists that could let a client in: API tokens of OAuth connections and refresh tokens."""
    return ApiToken.objects.exclude(audience="api").count(), RefreshToken.objects.count()


def mcp(token, path="/mcp/v1/"):
    return request(body={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                         "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                    "clientInfo": {"name": "t", "version": "0"}}},
                   headers={"authorization": f"Bearer {token}"}, path=path)


def error_of(response):
    assert response["Content-Type"].startswith("application/json"), response.content
    return response.json()["error"]


# --- discovery ------------------------------------------------------------------------------------------------

def test_protected_resource_metadata_for_each_endpoint_and_the_root():
    c = anonymous()
    v1 = c.get("/.well-known/oauth-protected-resource/mcp/v1").json()
    assert v1 == {"resource": V1, "authorization_servers": [BASE], "bearer_methods_supported": ["header"],
                  "scopes_supported": ["mcp:readonly", "mcp:operator", "mcp:supervised"],
                  "resource_name": "yuzu MCP: fleet, approvals, audit"}
    assert c.get("/.well-known/oauth-protected-resource/mcp/v1/").json() == v1
    assert c.get("/.well-known/oauth-protected-resource").json() == v1  # the root describes the main endpoint
    bridge = c.get("/.well-known/oauth-protected-resource/mcp/bridge").json()
    assert bridge["resource"] == BRIDGE and bridge["authorization_servers"] == [BASE]
    assert c.get("/.well-known/oauth-protected-resource/mcp/nope").status_code == 404
    assert c.post("/.well-known/oauth-protected-resource/mcp/v1").status_code == 405


def test_authorization_server_metadata_lists_exactly_what_is_supported():
    meta = anonymous().get("/.well-known/oauth-authorization-server").json()
    assert meta == {
        "issuer": BASE, "authorization_endpoint": f"{BASE}/oauth/authorize", "token_endpoint": f"{BASE}/oauth/token",
        "registration_endpoint": f"{BASE}/oauth/register", "revocation_endpoint": f"{BASE}/oauth/revoke",
        "scopes_supported": ["mcp:readonly", "mcp:operator", "mcp:supervised"],
        "response_types_supported": ["code"], "response_modes_supported": ["query"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_methods_supported": ["none", "client_secret_post", "client_secret_basic"],
        "revocation_endpoint_auth_methods_supported": ["none", "client_secret_post", "client_secret_basic"],
        "code_challenge_methods_supported": ["S256"], "client_id_metadata_document_supported": True,
        "authorization_response_iss_parameter_supported": True}
    # Every endpoint it names answers (here: refusing an empty request the OAuth way, not 404).
    assert anonymous().post("/oauth/token", {}).json()["error"] == "unsupported_grant_type"
    assert anonymous().post("/oauth/revoke", {}).status_code == 400
    assert anonymous().get("/oauth/authorize").status_code == 400


def test_public_url_is_the_issuer_when_set():
    with override_settings(YUZU_OAUTH_ISSUER="https://yuzu.example.com"):
        meta = anonymous().get("/.well-known/oauth-authorization-server").json()
        prm = anonymous().get("/.well-known/oauth-protected-resource/mcp/bridge").json()
        r = request(body={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}, path="/mcp/bridge/")
    assert meta["issuer"] == "https://yuzu.example.com" and meta["token_endpoint"].startswith("https://yuzu.example.com/")
    assert prm["resource"] == "https://yuzu.example.com/mcp/bridge"
    assert 'resource_metadata="https://yuzu.example.com/.well-known/oauth-protected-resource/mcp/bridge"' in \
        r.headers["www-authenticate"]


def test_mcp_401s_point_at_the_endpoints_metadata():
    r = request(body={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}})
    assert r.status == 401
    assert r.headers["www-authenticate"] == f'Bearer realm="yuzu", resource_metadata="{PRM_V1}"'
    r = request(body={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}, path="/mcp/bridge/",
                headers={"authorization": "Bearer yuzu_" + "0" * 64})
    assert r.headers["www-authenticate"] == ('Bearer realm="yuzu", resource_metadata="http://127.0.0.1:8000/'
                                             '.well-known/oauth-protected-resource/mcp/bridge", error="invalid_token"')


# --- dynamic client registration ------------------------------------------------------------------------------

def test_dynamic_registration_public_and_confidential_clients():
    public = registered(client_name="Claude")
    assert public["token_endpoint_auth_method"] == "none" and "client_secret" not in public
    assert public["grant_types"] == ["authorization_code", "refresh_token"] and public["redirect_uris"] == [REDIRECT]
    app = Application.objects.get(client_id=public["client_id"])
    assert (app.client_type, app.registration_source, app.name) == ("public", "dcr", "Claude")

    confidential = registered(token_endpoint_auth_method="client_secret_post")
    secret = confidential["client_secret"]
    stored = Application.objects.get(client_id=confidential["client_id"]).client_secret
    assert stored != secret and stored.startswith(("pbkdf2_", "argon2", "bcrypt"))  # hashed at rest
    row = audit("oauth.client.register", "success")[-1]
    assert secret not in row.detail and "auth_method=client_secret_post" in row.detail


@pytest.mark.parametrize("meta, error", [
    ({"redirect_uris": ["http://evil.example.com/cb"]}, "invalid_redirect_uri"),
    ({"redirect_uris": ["https://client.example.com/cb#frag"]}, "invalid_redirect_uri"),
    ({"redirect_uris": ["javascript:alert(1)"]}, "invalid_redirect_uri"),
    ({"redirect_uris": []}, "invalid_redirect_uri"),
    ({"redirect_uris": "https://client.example.com/cb"}, "invalid_redirect_uri"),
    ({"grant_types": ["client_credentials"]}, "invalid_client_metadata"),
    ({"grant_types": ["authorization_code", "implicit"]}, "invalid_client_metadata"),
    ({"response_types": ["token"]}, "invalid_client_metadata"),
    ({"token_endpoint_auth_method": "private_key_jwt"}, "invalid_client_metadata"),
    ({"client_name": "x" * 101}, "invalid_client_metadata"),
])
def test_registration_refuses_what_yuzu_does_not_support(meta, error):
    r = register(**meta)
    assert r.status_code == 400 and r.json()["error"] == error, r.content
    assert not Application.objects.exists()
    assert audit("oauth.client.register", "failure")


def test_registration_refuses_bodies_that_are_not_metadata():
    for body in (b"not json", b"[]", json.dumps({"redirect_uris": [REDIRECT], "pad": "x" * 17000}).encode()):
        r = anonymous().post("/oauth/register", body, content_type="application/json")
        assert r.status_code == 400 and r.json()["error"] == "invalid_client_metadata"
    r = anonymous().post("/oauth/register", {"redirect_uris": REDIRECT})  # a multipart form, not JSON
    assert r.status_code == 400 and r.json()["error"] == "invalid_client_metadata"
    assert anonymous().get("/oauth/register").status_code == 405
    assert not Application.objects.exists()


def test_registration_refuses_json_nested_past_the_parsers_depth():
    """Within the 16 KiB bound, arrays nested a few thousand deep made the JSON parser raise RecursionError — no
    ValueError, so no invalid_client_metadata: a 500."""
    for body in (b"[" * 5000 + b"]" * 5000, b'{"redirect_uris": ' + b"[" * 5000 + b"]" * 5000 + b"}"):
        r = anonymous().post("/oauth/register", body, content_type="application/json")
        assert r.status_code == 400 and r.json()["error"] == "invalid_client_metadata", r.content
    assert not Application.objects.exists()


@override_settings(YUZU_OAUTH_REGISTRATIONS_PER_HOUR=2)
def test_registration_is_rate_limited_per_address():
    assert register().status_code == 201 and register().status_code == 201
    r = register()
    assert r.status_code == 429 and r.json()["error"] == "temporarily_unavailable" and int(r["Retry-After"]) > 0
    assert Application.objects.count() == 2
    assert "reason=rate_limited" in audit("oauth.client.register", "denied")[0].detail


# --- the happy path -------------------------------------------------------------------------------------------

def test_consent_then_a_resource_bound_api_token(person):
    browser = person()
    client_id = registered(client_name="Claude")["client_id"]
    flow = Flow(client_id)
    page = flow.consent(browser)
    assert page.status_code == 200
    # a signed-in person's page with its form's CSRF token: no browser or proxy keeps a copy
    assert "no-store" in page["Cache-Control"] and "private" in page["Cache-Control"]
    html = page.content.decode()
    for fact in ("Claude", "/mcp/v1/", "alice", client_id, "127.0.0.1:9999", "registered itself"):
        assert fact in html, fact
    code = flow.approve(browser, tier="operator", days=7)
    assert Grant.objects.get().code == hash_secret(code)  # the code is stored as its hash only
    r = flow.exchange(code)
    assert r.status_code == 200 and r["Cache-Control"] == "no-store"
    assert not Grant.objects.exists()  # and it is gone once used
    body = r.json()
    assert set(body) == {"access_token", "token_type", "expires_in", "scope", "refresh_token"}
    assert body["scope"] == "mcp:operator" and body["token_type"] == "Bearer" and body["expires_in"] == 3600

    # The access token IS an API token: hashed, tiered, expiring, bound to /mcp/v1, owned by alice.
    token = ApiToken.objects.get(audience="mcp-v1")
    raw = body["access_token"]
    assert raw.startswith("yuzu_") and len(raw) == 69 and raw not in json.dumps(list(ApiToken.objects.values()),
                                                                                default=str)
    assert (token.owner.username, token.mcp_tier, token.prefix) == ("alice", "operator", raw[:12])
    assert timedelta(minutes=59) < token.expires_at - timezone.now() <= timedelta(hours=1)
    auth = Authorization.objects.get()
    assert auth.api_token == token and auth.expires_at.date() == (timezone.now() + timedelta(days=7)).date()
    assert token.name == f"Claude (OAuth, /mcp/v1/, until {auth.expires_at:%Y-%m-%d})"

    # It works on /mcp/v1/ — at its tier — and nowhere else.
    c = McpClient(raw)
    c.initialize()
    tools = {t["name"] for t in c.rpc("tools/list").json()["result"]["tools"]}
    assert "set_tag" in tools and "execute_instruction" in tools and "unlock_account" not in tools
    assert mcp(raw, "/mcp/bridge/").status == 401
    rest = anonymous().get("/api/v1/tokens", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert rest.status_code == 401 and rest.json()["error"]["message"] == "token not valid for this endpoint"

    # Audited at every step, never with a secret.
    assert [a for a in ("oauth.client.register", "oauth.consent", "api_token.create") if audit(a, "success")] == \
        ["oauth.client.register", "oauth.consent", "api_token.create"]
    every = " ".join(e.detail for e in AuditEvent.objects.all())
    for secret in (raw, body["refresh_token"], code, flow.verifier):
        assert secret not in every


def test_the_oauth_token_is_listed_and_revocable_like_any_api_token(person, mint):
    _, body = connect(person())
    cli = McpClient(mint("alice", role="Operator", tier="supervised"))
    cli.initialize()
    rows = cli.call("list_api_tokens").json()["result"]["structuredContent"]["tokens"]
    oauth_row = next(r for r in rows if r["name"].startswith("Test client (OAuth"))
    assert oauth_row["mcp_tier"] == "supervised" and not oauth_row["revoked"]
    rest = {"HTTP_AUTHORIZATION": f"Bearer {mint('alice', role='Operator')}"}  # an untiered CLI token
    assert oauth_row["id"] in {r["id"] for r in anonymous().get("/api/v1/tokens", **rest).json()["data"]}
    # It renews through its client, not by rotation...
    refused = anonymous().post(f"/api/v1/tokens/{oauth_row['id']}/rotate", {"overlap_secs": 0},
                               content_type="application/json", **rest)
    assert refused.status_code == 409 and "issued through OAuth" in refused.json()["error"]["message"]
    # ...and revoking it ends the connection: the access token at once, the refresh token on its next use.
    assert anonymous().delete(f"/api/v1/tokens/{oauth_row['id']}", **rest).status_code == 200
    assert mcp(body["access_token"]).status == 401
    r = refresh(Authorization.objects.get().application.client_id, body["refresh_token"])
    assert r.status_code == 400 and r.json()["error"] == "invalid_grant"
    assert Authorization.objects.get().revoked_reason == "access token revoked"


def test_a_bridge_token_is_not_valid_on_v1_and_the_other_way_round(person):
    browser = person()
    _, bridge = connect(browser, resource=BRIDGE)
    _, v1 = connect(browser, resource=V1 + "/")  # the trailing slash names the same resource
    assert ApiToken.objects.get(pk=Authorization.objects.get(audience="mcp-bridge").api_token_id).audience == \
        "mcp-bridge"
    assert mcp(bridge["access_token"], "/mcp/bridge/").status == 200
    refused = mcp(bridge["access_token"], "/mcp/v1/")
    assert refused.status == 401 and refused.error["message"] == "Unauthorized: token not valid for this endpoint"
    assert "/mcp/bridge/ only" in refused.error["data"]["remediation"]
    assert mcp(v1["access_token"], "/mcp/v1/").status == 200
    assert mcp(v1["access_token"], "/mcp/bridge/").status == 401


def test_a_new_consent_for_the_same_client_takes_the_connection_over(person):
    """Re-authorizing (or stepping up to another tier) keeps one connection: the same API token row, so the client's
    MCP session carries on; the previous consent's tokens stop working."""
    browser = person()
    flow, first = connect(browser, tier="readonly")
    c = McpClient(first["access_token"])
    c.initialize()
    _, second = connect(browser, client_id=flow.client_id, tier="operator")
    token = ApiToken.objects.get(audience="mcp-v1")
    assert token.mcp_tier == "operator" and token.prefix == second["access_token"][:12]
    assert mcp(first["access_token"]).status == 401
    assert refresh(flow.client_id, first["refresh_token"]).json()["error"] == "invalid_grant"
    c.token = second["access_token"]
    assert c.rpc("tools/list").status == 200  # the same session, now at the operator tier
    old, new = Authorization.objects.order_by("created_at")
    assert (old.revoked_reason, old.api_token, new.api_token) == ("superseded by a new consent", None, token)
    assert audit("oauth.token.reissue", "success")
    # Another endpoint, or another person, is another connection.
    connect(browser, client_id=flow.client_id, resource=BRIDGE)
    connect(person("bob"), client_id=flow.client_id)
    assert ApiToken.objects.exclude(audience="api").count() == 3


def test_two_consents_for_one_client_exchanged_at_once_still_make_one_connection(person):
    """Both code exchanges looked for the person's earlier connection of that client before either had written
    its own, found none, and each minted a token: two live connections (and API tokens) where one after the
    other makes one — the second taking the first's token over."""
    browser = person()
    for n in range(1, 6):  # two connections in most rounds on PostgreSQL
        flows = [Flow(registered()["client_id"])]
        flows.append(Flow(flows[0].client_id))
        codes = [flow.approve(browser) for flow in flows]
        answers = at_once(*[partial(flow.exchange, code) for flow, code in zip(flows, codes, strict=True)])
        assert [r.status_code for _, r in answers] == [200, 200], answers
        live = Authorization.objects.filter(application__client_id=flows[0].client_id, revoked_at__isnull=True)
        assert live.count() == 1
        assert ApiToken.objects.filter(audience="mcp-v1", revoked_at__isnull=True).count() == n  # one per client


# --- refresh: rotation and reuse detection ---------------------------------------------------------------------

def test_refresh_rotates_both_tokens_and_keeps_one_api_token_row(person):
    flow, first = connect(person(), tier="readonly")
    token = ApiToken.objects.get(audience="mcp-v1")
    r = refresh(flow.client_id, first["refresh_token"], resource=V1)
    assert r.status_code == 200, r.content
    second = r.json()
    assert second["access_token"] != first["access_token"] and second["refresh_token"] != first["refresh_token"]
    assert second["scope"] == "mcp:readonly"
    assert ApiToken.objects.filter(audience="mcp-v1").count() == 1  # the same row, a new secret
    token.refresh_from_db()
    assert token.prefix == second["access_token"][:12] and token.revoked_at is None
    assert mcp(first["access_token"]).status == 401 and mcp(second["access_token"]).status == 200
    assert audit("oauth.token.refresh", "success")


def test_a_refresh_cannot_widen_the_scope(person):
    flow, first = connect(person(), tier="readonly")
    r = refresh(flow.client_id, first["refresh_token"], scope="mcp:supervised")
    assert r.status_code == 400 and r.json()["error"] == "invalid_scope"
    assert ApiToken.objects.get(audience="mcp-v1").mcp_tier == "readonly"


def test_a_confidential_client_must_authenticate_at_the_token_endpoint(person):
    reg = registered(token_endpoint_auth_method="client_secret_post")
    flow = Flow(reg["client_id"])
    code = flow.approve(person())
    r = flow.exchange(code)  # no secret
    assert r.status_code == 401 and r.json()["error"] == "invalid_client"
    assert flow.exchange(code, client_secret="wrong").json()["error"] == "invalid_client"
    assert issued() == (0, 0)
    r = flow.exchange(code, client_secret=reg["client_secret"])
    assert r.status_code == 200 and r.json()["access_token"].startswith("yuzu_")


def test_a_replayed_refresh_token_revokes_the_whole_family(person):
    flow, first = connect(person())
    second = refresh(flow.client_id, first["refresh_token"]).json()
    replay = refresh(flow.client_id, first["refresh_token"])
    assert replay.status_code == 400 and replay.json()["error"] == "invalid_grant"
    # The thief's replay also ended the legitimate client's tokens: it signs in again.
    assert refresh(flow.client_id, second["refresh_token"]).json()["error"] == "invalid_grant"
    assert mcp(second["access_token"]).status == 401
    auth = Authorization.objects.get()
    assert auth.revoked_reason == "refresh token reused" and auth.api_token.revoked_at is not None
    assert not RefreshToken.objects.filter(revoked__isnull=True).exists()
    assert "refresh token reused" in audit("oauth.token", "denied")[-1].detail


def race_one_refresh_token(flow, refresh_token, monkeypatch, *, winner_answers_last=False):
    """Two threads (each its own database connection) present the same refresh token; both pass validation before
    either issues (a barrier holds them there). ``winner_answers_last``: the one that issued waits, after its
    commit, until the other has been refused — the reuse revokes what it had just issued."""

    from oauth.validators import Validator

    barrier, refused = threading.Barrier(2, timeout=10), threading.Event()
    validate, save = Validator.validate_refresh_token, Validator.save_bearer_token

    def both_validated(self, *args, **kwargs):
        ok = validate(self, *args, **kwargs)
        barrier.wait()
        return ok

    def ordered(self, *args, **kwargs):
        try:
            issued = save(self, *args, **kwargs)
        except Exception:
            refused.set()
            raise
        if winner_answers_last:
            refused.wait(10)
        return issued

    monkeypatch.setattr(Validator, "validate_refresh_token", both_validated)
    monkeypatch.setattr(Validator, "save_bearer_token", ordered)
    outcomes = at_once(partial(refresh, flow.client_id, refresh_token), partial(refresh, flow.client_id, refresh_token), timeout=30)
    monkeypatch.undo()
    assert all(kind == "ok" for kind, _ in outcomes), f"a request raised (a 500): {outcomes}"
    return [r for _, r in outcomes]


def assert_the_family_is_revoked_and_audited(flow, answers):
    for r in answers:
        if r.status_code == 200:
            won = r.json()
            assert mcp(won["access_token"]).status == 401
            assert refresh(flow.client_id, won["refresh_token"]).json()["error"] == "invalid_grant"
        else:
            assert r.status_code == 400 and r.json()["error"] == "invalid_grant", r.content
    auth = Authorization.objects.get()
    assert auth.revoked_reason == "refresh token reused" and auth.api_token.revoked_at is not None
    assert not RefreshToken.objects.filter(revoked__isnull=True).exists()
    assert "refresh token reused" in audit("oauth.token", "denied")[0].detail


def test_two_simultaneous_uses_of_one_refresh_token_are_reuse(person, monkeypatch):
    """Real concurrency: one use wins, the other is reuse — invalid_grant, the whole family revoked, audited — never
    a 500 (django-oauth-toolkit's locked rotation alone let the second through to a lookup of a token that no
    longer existed)."""
    flow, first = connect(person())
    answers = race_one_refresh_token(flow, first["refresh_token"], monkeypatch)
    assert sorted(r.status_code for r in answers) in ([200, 400], [400, 400]), [r.content for r in answers]
    assert_the_family_is_revoked_and_audited(flow, answers)


def test_a_refresh_revoked_by_a_simultaneous_reuse_before_it_answers_is_refused(person, monkeypatch):
    """The same race where the winner's answer comes after the loser revoked the family: what it issued is gone
    already, so it answers invalid_grant too, not a 500."""
    flow, first = connect(person())
    answers = race_one_refresh_token(flow, first["refresh_token"], monkeypatch, winner_answers_last=True)
    assert [r.status_code for r in answers] == [400, 400], [r.content for r in answers]
    assert_the_family_is_revoked_and_audited(flow, answers)


def test_a_refresh_token_asking_for_another_resource_or_client_gets_nothing(person):
    flow, first = connect(person())
    before = ApiToken.objects.get(audience="mcp-v1").token_hash
    r = refresh(flow.client_id, first["refresh_token"], resource=BRIDGE)
    assert r.status_code == 400 and r.json()["error"] == "invalid_target"
    other = registered()["client_id"]
    assert refresh(other, first["refresh_token"]).json()["error"] == "invalid_grant"
    assert ApiToken.objects.get(audience="mcp-v1").token_hash == before  # nothing issued
    assert refresh(flow.client_id, first["refresh_token"]).status_code == 200  # still the client's own


def test_no_refresh_after_the_consent_expires(person):
    flow, first = connect(person(), days=1)
    Authorization.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    r = refresh(flow.client_id, first["refresh_token"])
    assert r.status_code == 400 and r.json()["error"] == "invalid_grant"


def test_the_access_token_never_outlives_the_consent(person, settings):
    settings.YUZU_OAUTH_ACCESS_TOKEN_SECONDS = 3600
    flow, first = connect(person(), days=1)
    Authorization.objects.update(expires_at=timezone.now() + timedelta(minutes=10))
    second = refresh(flow.client_id, first["refresh_token"]).json()
    assert 590 <= second["expires_in"] <= 600
    assert ApiToken.objects.get(audience="mcp-v1").expires_at <= Authorization.objects.get().expires_at


def test_expired_and_revoked_access_tokens_are_refused(person):
    _, body = connect(person())
    ApiToken.objects.filter(audience="mcp-v1").update(expires_at=timezone.now() - timedelta(seconds=1))
    r = mcp(body["access_token"])
    assert r.status == 401 and r.error["message"] == "Unauthorized: token expired or revoked"
    assert 'error="invalid_token"' in r.headers["www-authenticate"]
    _, other = connect(person("bob"))
    Authorization.objects.get(user__username="bob").revoke("test")
    assert mcp(other["access_token"]).status == 401


# --- authorization codes: PKCE, reuse, redirect URI, resource ---------------------------------------------------

def test_a_wrong_pkce_verifier_gets_nothing_and_burns_the_code(person):
    browser = person()
    flow = Flow(registered()["client_id"])
    code = flow.approve(browser)
    r = flow.exchange(code, verifier="x" * 64)
    assert r.status_code == 400 and r.json()["error"] == "invalid_grant"
    assert issued() == (0, 0)
    assert flow.exchange(code).json()["error"] == "invalid_grant"  # the right verifier is too late now
    assert issued() == (0, 0)
    assert "PKCE" in audit("oauth.token", "denied")[0].detail
    missing = Flow(flow.client_id)
    r = token_request({"grant_type": "authorization_code", "code": missing.approve(browser), "client_id": flow.client_id,
                       "redirect_uri": REDIRECT})
    assert r.status_code == 400 and r.json()["error"] == "invalid_request"  # no verifier at all
    assert issued() == (0, 0)


def test_a_reused_code_is_refused_and_revokes_what_it_issued(person):
    flow = Flow(registered()["client_id"])
    code = flow.approve(person())
    first = flow.exchange(code).json()
    again = flow.exchange(code)
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant"
    assert issued()[0] == 1  # nothing new
    assert mcp(first["access_token"]).status == 401  # RFC 6749 §4.1.2: what the code issued is revoked
    assert Authorization.objects.get().revoked_reason == "authorization code reused"
    assert refresh(flow.client_id, first["refresh_token"]).json()["error"] == "invalid_grant"


def test_a_code_expires_after_a_minute(person):
    flow = Flow(registered()["client_id"])
    code = flow.approve(person())
    Grant.objects.update(expires=timezone.now() - timedelta(seconds=1))
    assert flow.exchange(code).json()["error"] == "invalid_grant"
    assert issued() == (0, 0)


def test_a_mismatched_redirect_uri_is_refused_at_both_ends(person):
    browser = person()
    client_id = registered(redirect_uris=[REDIRECT, "http://127.0.0.1:9999/other"])["client_id"]
    # At the authorization endpoint: an unregistered URI is an error page, never a redirect there.
    for uri in ("https://evil.example.com/callback", REDIRECT + "/x", REDIRECT + "?x=1", "http://localhost:9999/callback"):
        page = Flow(client_id, redirect=uri).consent(browser)
        assert page.status_code == 400 and "Location" not in page, uri
        assert "invalid_request" in page.content.decode() and "Mismatching redirect URI" in page.content.decode()
    # At the token endpoint: the code was issued for REDIRECT; another registered URI does not redeem it.
    flow = Flow(client_id)
    code = flow.approve(browser)
    r = flow.exchange(code, redirect_uri="http://127.0.0.1:9999/other")
    assert r.status_code == 400 and r.json()["error"] == "invalid_grant"
    assert issued() == (0, 0)


def test_a_code_for_one_resource_does_not_buy_a_token_for_another(person):
    flow = Flow(registered()["client_id"], resource=BRIDGE)
    code = flow.approve(person())
    r = flow.exchange(code, resource=V1)
    assert r.status_code == 400 and r.json()["error"] == "invalid_target"
    assert issued() == (0, 0)


@pytest.mark.parametrize("change, error", [
    ({"state": None}, "invalid_request"),
    ({"code_challenge_method": "plain"}, "invalid_request"),
    ({"code_challenge_method": None}, "invalid_request"),
    ({"code_challenge": None, "code_challenge_method": None}, "invalid_request"),
    ({"resource": "https://other.example.com/mcp"}, "invalid_target"),
    ({"resource": BASE + "/api/v1"}, "invalid_target"),
    ({"response_type": "token"}, "unsupported_response_type"),
])
def test_authorization_requests_yuzu_refuses_go_back_to_the_client(person, change, error):
    browser = person()
    flow = Flow(registered()["client_id"])
    flow.params.update(change)
    flow.params = {k: v for k, v in flow.params.items() if v is not None}
    r = flow.consent(browser)
    assert r.status_code == 302, r.content[:500]
    query = callback(r)
    assert query["error"] == error and query["iss"] == BASE
    assert query.get("state") == flow.params.get("state")
    assert flow.decide(browser).status_code == 302 and not Authorization.objects.exists()


def test_two_resources_in_one_request_are_refused(person):
    flow = Flow(registered()["client_id"])
    r = person().get(flow.url + "&resource=" + BRIDGE)
    assert callback(r)["error"] == "invalid_target"


def test_an_unknown_client_gets_an_error_page_not_a_redirect(person):
    page = Flow("no-such-client").consent(person())
    assert page.status_code == 400 and "Location" not in page
    assert "Invalid client_id parameter value" in page.content.decode()
    assert "error=invalid_request" in audit("oauth.authorize", "denied")[0].detail


# --- the consent page -------------------------------------------------------------------------------------------

def test_signing_in_is_the_admins_login_then_a_fresh_authenticator_proof(person, make_user):
    flow = Flow(registered()["client_id"])
    r = anonymous().get(flow.url)
    assert r.status_code == 302 and r["Location"].startswith("/admin/login/?next=/oauth/authorize%3F")
    login = anonymous().get(r["Location"])
    assert "Sign in to connect an AI client" in login.content.decode()
    stale = person("bob", fresh=False)
    r = stale.get(flow.url)
    assert r.status_code == 302 and r["Location"].startswith("/admin/stepup/?next=%2Foauth%2Fauthorize%3F")
    assert stale.post(flow.url, {"decision": "approve", "tier": "readonly", "days": 1}).status_code == 302
    assert not Authorization.objects.exists()
    # A signed-in user who is not staff cannot use the admin's login, so cannot consent either.
    user = make_user("carol", "Operator")
    assert signed_in(user).get(flow.url)["Location"].startswith("/admin/login/")


def test_the_tier_is_capped_by_the_users_roles_and_by_what_the_client_asked(person):
    client_id = registered()["client_id"]
    viewer = person("vera", role="Viewer")
    flow = Flow(client_id)
    html = flow.consent(viewer).content.decode()
    assert 'value="readonly"' in html and 'value="operator"' not in html and "allow up to\n          <strong>readonly" \
        in html
    r = flow.decide(viewer, tier="supervised")
    assert r.status_code == 400 and not Authorization.objects.exists()
    # An operator whose client asked for readonly only may not raise it.
    op = person()
    asked = Flow(client_id, scope="mcp:readonly")
    assert 'value="operator"' not in asked.consent(op).content.decode()
    assert asked.decide(op, tier="operator").status_code == 400
    assert asked.exchange(asked.approve(op, tier="readonly")).json()["scope"] == "mcp:readonly"
    # Asking for several tiers asks for the highest; unknown scopes grant nothing.
    several = Flow(client_id, scope="mcp:readonly mcp:operator offline_access")
    html = several.consent(op).content.decode()
    assert 'value="operator" required id="id_tier_1" checked' in html and 'value="supervised"' not in html


def test_without_apitoken_write_no_client_can_connect(person):
    approver = person("olga", role="Approver")
    flow = Flow(registered()["client_id"])
    page = flow.consent(approver)
    assert page.status_code == 200 and 'id="no-tier"' in page.content.decode()
    assert 'id="approve-button"' not in page.content.decode()
    assert flow.decide(approver, tier="readonly").status_code == 400
    r = flow.decide(approver, decision="deny")
    assert callback(r)["error"] == "access_denied"
    assert not Authorization.objects.exists() and issued() == (0, 0)


@pytest.mark.parametrize("days", [0, 91, -1, "ninety"])
def test_the_expiry_is_at_most_90_days(person, days):
    flow = Flow(registered()["client_id"])
    assert flow.decide(person(), days=days).status_code == 400
    assert not Authorization.objects.exists()


def test_deny_goes_back_with_access_denied_and_issues_nothing(person):
    flow = Flow(registered()["client_id"])
    query = callback(flow.decide(person(), decision="deny"))
    assert query == {"error": "access_denied", "state": flow.state, "iss": BASE}
    assert not Authorization.objects.exists() and not Grant.objects.exists()
    assert audit("oauth.consent", "denied")


def test_approve_is_a_post_with_csrf(person):
    browser = person(enforce_csrf_checks=True)
    flow = Flow(registered()["client_id"])
    assert browser.post(flow.url, {"decision": "approve", "tier": "readonly", "days": 1}).status_code == 403
    page = flow.consent(browser)
    token = page.context["csrf_token"]
    r = browser.post(flow.url, {"decision": "approve", "tier": "readonly", "days": 1, "csrfmiddlewaretoken": token})
    assert r.status_code == 302 and "code" in callback(r)


# --- revocation ---------------------------------------------------------------------------------------------------

def test_revoking_a_client_in_the_admin_ends_every_connection_and_keeps_it_out(person, make_user):
    browser = person()
    client_id = registered()["client_id"]
    _, body = connect(browser, client_id=client_id)
    admin_user = make_user("root", superuser=True)
    admin = signed_in(admin_user)
    app = Application.objects.get(client_id=client_id)
    listing = admin.get("/admin/oauth2_provider/application/").content.decode()
    assert "Test client" in listing and "active" in listing
    r = admin.post("/admin/oauth2_provider/application/", {"action": "revoke", "_selected_action": [app.pk]})
    assert r.status_code == 302
    assert mcp(body["access_token"]).status == 401
    assert refresh(client_id, body["refresh_token"]).json()["error"] == "invalid_client"  # unknown now
    page = Flow(client_id).consent(browser)
    assert page.status_code == 400 and "Location" not in page
    assert "revoked" in admin.get(f"/admin/oauth2_provider/application/{app.pk}/change/").content.decode()
    assert audit("oauth.client.revoke", "success")[0].principal == "root"


def test_revoking_one_connection_in_the_admin(person, make_user):
    _, alice = connect(person())
    _, bob = connect(person("bob"))
    admin = signed_in(make_user("root", superuser=True))
    auth = Authorization.objects.get(user__username="alice")
    assert "alice" in admin.get("/admin/oauth/authorization/").content.decode()
    admin.post("/admin/oauth/authorization/", {"action": "revoke", "_selected_action": [auth.pk]})
    assert mcp(alice["access_token"]).status == 401 and mcp(bob["access_token"]).status == 200


def test_a_staff_user_who_may_only_view_oauth_clients_and_connections_revokes_neither(person, make_user):
    """Revoking is a change: the revoke actions were offered to whoever could view the pages, and ran for them."""
    from django.contrib.auth.models import Permission

    browser = person()
    client_id = registered()["client_id"]
    _, body = connect(browser, client_id=client_id)
    viewer = make_user("viewer")
    viewer.is_staff = True
    viewer.save()
    viewer.user_permissions.add(*Permission.objects.filter(codename__in=["view_application", "view_authorization"]))
    staff = signed_in(viewer)
    app, auth = Application.objects.get(client_id=client_id), Authorization.objects.get()
    for page, pk in (("/admin/oauth2_provider/application/", app.pk), ("/admin/oauth/authorization/", auth.pk)):
        listing = staff.get(page)
        assert listing.status_code == 200 and 'value="revoke"' not in listing.content.decode()
        staff.post(page, {"action": "revoke", "_selected_action": [pk]})
    assert mcp(body["access_token"]).status == 200
    assert not audit("oauth.client.revoke", "success")
    assert not Authorization.objects.filter(revoked_at__isnull=False).exists()


def test_the_client_may_revoke_its_own_tokens(person):
    flow, body = connect(person())
    other = registered()["client_id"]
    assert anonymous().post("/oauth/revoke", {"token": body["refresh_token"], "client_id": other}).status_code == 200
    assert mcp(body["access_token"]).status == 200  # another client cannot revoke it
    r = anonymous().post("/oauth/revoke", {"token": body["access_token"], "client_id": flow.client_id})
    assert r.status_code == 200
    assert mcp(body["access_token"]).status == 401
    assert refresh(flow.client_id, body["refresh_token"]).json()["error"] == "invalid_grant"


# --- step-up -------------------------------------------------------------------------------------------------------

def test_a_call_above_the_tier_asks_an_oauth_client_to_step_up(person, mint):
    _, body = connect(person(), tier="readonly")
    c = McpClient(body["access_token"])
    c.initialize()
    r = c.call("set_tag", {"agent_id": "a1", "key": "k", "value": "v"})
    assert r.status == 403 and r.error["code"] == -32004
    assert r.headers["www-authenticate"] == (f'Bearer realm="yuzu", resource_metadata="{PRM_V1}", '
                                             'error="insufficient_scope", scope="mcp:operator"')
    # A pasted token is answered as always; so is an OAuth token whose holder's roles reach no higher tier.
    pasted = McpClient(mint("alice", role="Operator", tier="readonly"))
    pasted.initialize()
    r = pasted.call("set_tag", {"agent_id": "a1", "key": "k", "value": "v"})
    assert r.status == 200 and r.error["code"] == -32004 and "www-authenticate" not in r.headers
    _, vera = connect(person("vera", role="Viewer"), tier="readonly")
    c = McpClient(vera["access_token"])
    c.initialize()
    assert c.call("set_tag", {"agent_id": "a1", "key": "k", "value": "v"}).status == 200


def test_a_token_request_never_returns_500_on_garbage(person):
    flow, body = connect(person())
    for data in ({"grant_type": "authorization_code", "code": "\x00", "client_id": flow.client_id,
                  "code_verifier": "x" * 50, "redirect_uri": REDIRECT},
                 {"grant_type": "refresh_token", "refresh_token": "\x00" * 3, "client_id": flow.client_id},
                 {"grant_type": "refresh_token", "refresh_token": body["refresh_token"], "client_id": "\x00"},
                 {"grant_type": "password", "username": "alice", "password": "alice-password-1",
                  "client_id": flow.client_id},
                 {"grant_type": "client_credentials", "client_id": flow.client_id}):
        r = token_request(data)
        assert 400 <= r.status_code < 500, (data, r.status_code, r.content)
    # NUL characters (PostgreSQL cannot even look them up) are refused at every endpoint, before any query.
    assert anonymous().get("/oauth/authorize", {"client_id": "\x00"}).status_code == 400
    assert anonymous().post("/oauth/revoke", {"token": "a\x00", "client_id": flow.client_id}).status_code == 400
    assert anonymous().post("/oauth/token", {"grant_type": "refresh_token", "refresh_token": "\x00"}).status_code == 400
    r = register(redirect_uris=["https://client.example.com/\x00cb"])
    assert r.status_code == 400 and r.json()["error"] == "invalid_redirect_uri"


def test_a_device_code_token_request_is_an_unsupported_grant_not_a_500():
    """django-oauth-toolkit's token view sends grant_type=device_code to its device flow before the server, which
    read the device_code parameter unchecked (a 500 without it) and answered device_not_found (404) with it: yuzu
    has no device grant, so it is unsupported_grant_type like any other grant yuzu does not offer."""
    client_id = registered()["client_id"]
    for extra in ({}, {"device_code": "x"}):
        r = token_request({"grant_type": "urn:ietf:params:oauth:grant-type:device_code", "client_id": client_id,
                           **extra})
        assert r.status_code == 400 and error_of(r) == "unsupported_grant_type", r.content


@pytest.mark.parametrize("uri", ["https://[::1/cb", "https://client.example.com:99999/cb",
                                 "https://client.example.com:port/cb", "http://127.0.0.1:65536/cb"])
def test_registration_refuses_a_redirect_uri_that_does_not_parse(uri):
    """An unterminated IPv6 host made the URI parser raise inside the metadata check: a 500. A port that is no
    port registered a client no browser could be sent back to."""
    r = register(redirect_uris=[uri])
    assert r.status_code == 400 and r.json()["error"] == "invalid_redirect_uri", r.content
    assert not Application.objects.exists()


@pytest.mark.parametrize("uri", ["https://client.example.com@evil.example.com/cb",
                                 "https://user:pw@client.example.com/cb", "http://x@127.0.0.1:9999/callback"])
def test_registration_refuses_credentials_in_a_redirect_uri(uri):
    """The consent page tells the person where the token goes; a redirect URI with a user part read
    `client.example.com@evil.example.com` there, while the browser goes to evil.example.com."""
    r = register(redirect_uris=[uri])
    assert r.status_code == 400 and r.json()["error"] == "invalid_redirect_uri", r.content


@pytest.mark.parametrize("challenge", ["A" * 129, "A" * 200, "A" * 42, "A" * 44, "é" * 43, "A" * 42 + "="])
def test_a_code_challenge_that_is_no_s256_challenge_goes_back_to_the_client(person, challenge):
    """An S256 challenge is 43 base64url characters (RFC 7636 §4.2). Anything else could never be met by a verifier,
    and a long one broke the approval on PostgreSQL (a 500: the grant's column holds 128)."""
    browser = person()
    flow = Flow(registered()["client_id"], code_challenge=challenge)
    for r in (flow.consent(browser), flow.decide(browser)):
        assert r.status_code == 302, r.content[:300]
        assert callback(r)["error"] == "invalid_request"
    assert not Authorization.objects.exists() and not Grant.objects.exists()


def test_openid_parameters_are_not_kept_with_the_code(person):
    """yuzu is no OpenID provider: a nonce (kept in a 255-character column: a longer one was a 500 on PostgreSQL
    at the approval) or claims mean nothing here and are not stored."""
    flow = Flow(registered()["client_id"], nonce="n" * 300, claims='{"id_token": {"email": null}}')
    code = flow.approve(person())
    grant = Grant.objects.get()
    assert (grant.nonce, grant.claims) == ("", "{}")
    assert flow.exchange(code).status_code == 200


@pytest.mark.parametrize("mode", ["fragment", "form_post", "jwt", ""])
def test_only_the_query_response_mode_is_offered(person, mode):
    """The metadata says response_modes_supported ["query"], but response_mode=fragment was honoured: the code in a
    fragment, which browsers carry across redirects (to wherever an open redirect on the client's callback sends
    it). Another mode is refused — in the query, so the client sees the error."""
    browser = person()
    flow = Flow(registered()["client_id"], response_mode=mode)
    for r in (flow.consent(browser), flow.decide(browser)):
        assert r.status_code == 302 and "#" not in r["Location"], r.get("Location")
        assert callback(r)["error"] == "invalid_request"
    assert not Grant.objects.exists()
    assert "code" in callback(Flow(flow.client_id, response_mode="query").decide(browser))


def race_one_code(flow, code, monkeypatch, *, second_waits_in):
    """Two threads (each its own database connection) exchange the same code; both pass validate_code before either
    issues. The second then waits, in ``second_waits_in`` (a Validator method), until the first has issued and
    committed."""

    from oauth.validators import Validator

    barrier, first_done, lock, arrived = threading.Barrier(2, timeout=10), threading.Event(), threading.Lock(), []
    validate, wait_in, save = (Validator.validate_code, getattr(Validator, second_waits_in),
                               Validator.save_bearer_token)

    def both_validated(self, *args, **kwargs):
        ok = validate(self, *args, **kwargs)
        barrier.wait()
        return ok

    def one_after_the_other(self, *args, **kwargs):
        with lock:
            arrived.append(None)
            second = len(arrived) > 1
        if second:
            first_done.wait(10)
        return wait_in(self, *args, **kwargs)

    def saved(self, *args, **kwargs):
        try:
            return save(self, *args, **kwargs)
        finally:
            first_done.set()

    monkeypatch.setattr(Validator, "validate_code", both_validated)
    monkeypatch.setattr(Validator, second_waits_in, one_after_the_other)
    if second_waits_in != "save_bearer_token":
        monkeypatch.setattr(Validator, "save_bearer_token", saved)
    else:
        monkeypatch.setattr(Validator, "invalidate_authorization_code", lambda *a, **k: first_done.set())
    outcomes = at_once(partial(flow.exchange, code), partial(flow.exchange, code), timeout=30)
    monkeypatch.undo()
    assert all(kind == "ok" for kind, _ in outcomes), f"a request raised (a 500): {outcomes}"
    return [r for _, r in outcomes]


@pytest.mark.parametrize("second_waits_in", ["get_code_challenge", "save_bearer_token"])
def test_two_simultaneous_exchanges_of_one_code(person, monkeypatch, second_waits_in):
    """The first exchange issues; the second — which had validated the code while it still existed — found it gone
    when it read the PKCE challenge (a 500: the grant was None) or when it claimed the code (invalid_grant, but what
    the first use issued stayed live, where a code used twice one after the other revokes it, RFC 6749 §4.1.2)."""
    flow = Flow(registered()["client_id"])
    code = flow.approve(person())
    answers = race_one_code(flow, code, monkeypatch, second_waits_in=second_waits_in)
    assert sorted(r.status_code for r in answers) == [200, 400], [r.content for r in answers]
    won = next(r for r in answers if r.status_code == 200).json()
    assert error_of(next(r for r in answers if r.status_code == 400)) == "invalid_grant"
    assert mcp(won["access_token"]).status == 401
    assert refresh(flow.client_id, won["refresh_token"]).json()["error"] == "invalid_grant"
    assert Authorization.objects.get().revoked_reason == "authorization code reused"


def test_an_oauth_token_obtains_no_token_that_outgrows_its_endpoint(person, mint):
    """A token bound to /mcp/v1/ minted (after an approval that said nothing of it) an API token valid on the REST
    API and /mcp/bridge/ too, or rotated one of its person's pasted tokens to obtain its successor's secret: an
    endpoint-bound token obtains no token at all; its client renews it through its connection."""
    from approvals.models import Approval

    _, body = connect(person(), tier="supervised")
    pasted = ApiToken.objects.get(token_hash=hash_secret(mint("alice", role="Operator", tier="supervised")))
    ApiToken.objects.filter(pk=pasted.pk).update(expires_at=timezone.now() + timedelta(minutes=30))
    c = McpClient(body["access_token"])
    c.initialize()
    until = (timezone.now() + timedelta(minutes=30)).isoformat()
    for tool, args in (("create_api_token", {"name": "escape", "mcp_tier": "supervised", "expires_at": until}),
                       ("rotate_api_token", {"token_id": pasted.pk})):
        r = c.call(tool, args)
        assert r.error and r.error["code"] == -32003, (tool, r.json())
        assert "bound to one endpoint" in r.error["message"]
    assert not Approval.objects.exists()
    assert ApiToken.objects.filter(audience="api").count() == 1


def test_a_stream_opened_with_an_access_token_ends_when_a_refresh_replaces_it(person):
    """Held-open streams re-check what admitted them (mcp.streaming.watch), by the token's row: a refresh keeps the
    row and replaces its secret, so a stream opened with a stolen access token outlived that token's hour for as
    long as the connection was refreshed (up to 90 days). It ends like one of a revoked token; the client's MCP
    session (keyed by the row) carries on, and its client reopens the stream with the new token."""
    from mcp.streaming import watch
    from mcp.streaming.sessions import store
    from yuzu.auth import principal_for_token

    flow, first = connect(person())
    opened = principal_for_token(first["access_token"], audiences=("mcp-v1",))
    session = store().create(opened.key, "v1", "2025-11-25", "t", "0").id
    assert watch.revalidate_all([(opened, session)]) == ["ok"]
    second = refresh(flow.client_id, first["refresh_token"]).json()
    assert watch.revalidate_all([(opened, session)]) == ["credential_revoked"]
    reopened = principal_for_token(second["access_token"], audiences=("mcp-v1",))
    assert reopened.key == opened.key and watch.revalidate_all([(reopened, session)]) == ["ok"]


def test_a_revocation_while_a_refresh_is_issuing_neither_deadlocks_nor_lets_it_through(person, monkeypatch):
    """A refresh locks its refresh token, then renews the access token's row; revoking the connection (the client's
    revocation, a replayed refresh token, the admin) locked the access token's row, then the refresh tokens: on
    PostgreSQL each waited for the other until one was aborted as a deadlock — a 500, and when the revocation was
    the one aborted (a replay's reuse detection), the connection lived on. Both now lock in the same order."""
    import time

    from django.db import connection

    flow, first = connect(person())
    issuing, revoking, outcomes = threading.Event(), threading.Event(), {}
    issue = Authorization.issue_access_token

    def slow_issue(self, *args, **kwargs):
        issuing.set()  # the refresh token is claimed (locked) in this transaction
        revoking.wait(10)
        time.sleep(0.5)  # the revocation has taken what locks it can, and waits
        return issue(self, *args, **kwargs)

    monkeypatch.setattr(Authorization, "issue_access_token", slow_issue)

    def run(name, call):
        try:
            outcomes[name] = call()
        except Exception as exc:  # a 500 in the test client
            outcomes[name] = exc
        finally:
            connection.close()

    def revoke():
        issuing.wait(10)
        revoking.set()
        return anonymous().post("/oauth/revoke", {"token": first["access_token"], "client_id": flow.client_id})

    threads = [threading.Thread(target=run, args=("refresh", partial(refresh, flow.client_id, first["refresh_token"]))),
               threading.Thread(target=run, args=("revoke", revoke))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    monkeypatch.undo()
    assert not any(isinstance(o, Exception) for o in outcomes.values()), outcomes
    assert outcomes["revoke"].status_code == 200 and outcomes["refresh"].status_code in (200, 400)
    assert Authorization.objects.get().revoked_reason == "revoked by the client"
    assert ApiToken.objects.get(audience="mcp-v1").revoked_at is not None
    if outcomes["refresh"].status_code == 200:
        won = outcomes["refresh"].json()
        assert mcp(won["access_token"]).status == 401
        assert refresh(flow.client_id, won["refresh_token"]).json()["error"] == "invalid_grant"


def test_a_form_field_does_not_talk_the_response_mode_check_round(person):
    """The code is made from the authorization request's query alone, while the validation reads the posted form
    too: a response_mode=query field beside a query asking for fragment is still refused."""
    browser = person()
    flow = Flow(registered()["client_id"], response_mode="fragment")
    r = browser.post(flow.url, {"decision": "approve", "tier": "supervised", "days": 30, "response_mode": "query"})
    assert r.status_code == 302 and "#" not in r["Location"] and callback(r)["error"] == "invalid_request"
    assert not Grant.objects.exists()


# --- a person an administrator locked out (docs/tokens-and-rbac.md "Account lockout") ------------------------------

def lock_out(username):
    from django.contrib.auth import get_user_model

    from yuzu.accounts import lock_account
    from yuzu.rbac import Principal

    admin = get_user_model().objects.create_superuser("root", "", "pw-root")
    lock_account(Principal(user=admin, via="session"), username, timezone.now() + timedelta(minutes=30))
    return Principal(user=admin, via="session")


def test_a_locked_persons_connection_neither_works_nor_refreshes_until_unlocked(person):
    """Before, the lock ended the person's admin sessions only: their client's access token kept working, and the
    refresh grant kept issuing new ones for as long as the lock lasted. Now nothing is issued (invalid_grant,
    audited), the access token is refused — and the lock revokes nothing: once it is lifted the same refresh token
    goes on."""
    from yuzu.accounts import unlock_account

    flow, body = connect(person())
    assert mcp(body["access_token"]).status == 200
    token_before = ApiToken.objects.get(audience="mcp-v1").token_hash
    admin = lock_out("alice")
    refused = mcp(body["access_token"])
    assert refused.status == 401 and refused.error["message"] == "Unauthorized: account locked by an administrator"
    r = refresh(flow.client_id, body["refresh_token"])
    assert r.status_code == 400 and r.json()["error"] == "invalid_grant"
    assert ApiToken.objects.get(audience="mcp-v1").token_hash == token_before  # nothing issued
    assert RefreshToken.objects.filter(revoked__isnull=True).count() == 1
    assert "reason=user locked" in audit("oauth.token", "denied")[-1].detail
    assert Authorization.objects.get().revoked_at is None

    unlock_account(admin, "alice")
    assert mcp(body["access_token"]).status == 200
    again = refresh(flow.client_id, body["refresh_token"])
    assert again.status_code == 200, again.content
    assert mcp(again.json()["access_token"]).status == 200


def test_a_locked_person_gets_no_token_for_a_code_issued_before_the_lock(person):
    flow = Flow(registered()["client_id"])
    code = flow.approve(person())
    lock_out("alice")
    r = flow.exchange(code)
    assert r.status_code == 400 and r.json()["error"] == "invalid_grant"
    assert issued() == (0, 0)
    assert "reason=user locked" in audit("oauth.token", "denied")[-1].detail


def test_a_deactivated_persons_connection_does_not_refresh(person):
    from django.contrib.auth import get_user_model

    flow, body = connect(person())
    get_user_model().objects.filter(username="alice").update(is_active=False)
    assert mcp(body["access_token"]).status == 401
    r = refresh(flow.client_id, body["refresh_token"])
    assert r.status_code == 400 and r.json()["error"] == "invalid_grant"
    assert "reason=user inactive" in audit("oauth.token", "denied")[-1].detail


# --- where an access token may travel -------------------------------------------------------------------------

@pytest.mark.parametrize("resource, path", [(V1, "/mcp/v1/"), (BRIDGE, "/mcp/bridge/")])
def test_an_access_token_in_x_yuzu_token_is_an_unknown_token(person, resource, path):
    """docs/oauth.md: OAuth tokens travel only in the Authorization header (RFC 6750 §2.1); X-Yuzu-Token took them
    too. It answers exactly as a token that does not exist does — the same 401, message and challenge."""
    _, body = connect(person(), resource=resource)

    def initialize(headers):
        return request(body={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                             "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                        "clientInfo": {"name": "t", "version": "0"}}}, headers=headers, path=path)

    assert initialize({"authorization": f"Bearer {body['access_token']}"}).status == 200
    refused = initialize({"x-yuzu-token": body["access_token"]})
    unknown = initialize({"x-yuzu-token": "yuzu_" + "0" * 64})
    assert refused.status == unknown.status == 401
    assert refused.error["message"] == unknown.error["message"] == "Unauthorized: unknown token"
    assert refused.error["data"]["remediation"] == unknown.error["data"]["remediation"]
    assert refused.headers["www-authenticate"] == unknown.headers["www-authenticate"]


# --- loopback redirect URIs: any port, but a port (RFC 8252 §7.3) -----------------------------------------------

@pytest.mark.parametrize("port", ["0", "65536", "99999999999999999999", "-1", "+80", "abc", "８０"])
def test_a_loopback_redirect_uri_with_no_usable_port_is_an_error_page(person, port):
    """Any port may replace the registered loopback URI's at the time of the request — but only a port (1–65535):
    port 0, one out of range or no number must be a clear 400, never a redirect to it nor a 500."""
    browser = person()
    flow = Flow(registered()["client_id"], redirect=f"http://127.0.0.1:{port}/callback")
    for r in (flow.consent(browser), flow.decide(browser)):
        assert r.status_code == 400 and "Location" not in r, (r.status_code, r.content[:300])
        assert "port" in r.content.decode()
    for fault in ({"state": None}, {"response_type": "token"}, {"code_challenge_method": "plain"}):
        # a fault that goes back to the client must not go back to this URI either
        faulty = Flow(flow.client_id, redirect=flow.redirect, **fault)
        r = faulty.consent(browser)
        assert r.status_code == 400 and "Location" not in r, (fault, r.status_code, r.get("Location"))
    assert not Authorization.objects.exists() and not Grant.objects.exists()


def test_a_loopback_redirect_uri_on_another_port_still_works(person):
    browser = person()
    flow = Flow(registered()["client_id"], redirect="http://127.0.0.1:65535/callback")
    r = flow.exchange(flow.approve(browser))
    assert r.status_code == 200, r.content


def test_registration_refuses_port_zero():
    r = register(redirect_uris=["http://127.0.0.1:0/callback"])
    assert r.status_code == 400 and r.json()["error"] == "invalid_redirect_uri", r.content
