"""The bridge catalogue in-process (no panes): the exact tool surface of spec §3, identity from the
token, tiers and RBAC, schema refusals, the guard and the worker environment."""

from datetime import timedelta

import pytest
from django.utils import timezone

from bridge.failures import BridgeFailure
from bridge.guard import SubscriptionGuard, substitute, worker_env
from bridge.models import Member, Profile
from bridge.profiles import seed_profiles
from tests.support.mcp_http import McpClient, request
from yuzu.models import ApiToken, AuditEvent
from yuzu.rbac import Principal

pytestmark = pytest.mark.django_db(transaction=True)
BRIDGE = "/mcp/bridge/"

SPEC_PARAMS = {
    "bridge_send": {"content", "sessionId", "timeoutMs", "wait", "autoSpawn", "turnId"},
    "bridge_reply": {"content", "final"},
    "bridge_ask": {"content", "timeoutMs"},
    "bridge_status": {"sessionId"},
    "bridge_spawn": {"profile"},
    "bridge_list": set(),
    "bridge_stop": {"paneId"},
    "bridge_poll": {"timeoutMs", "limit"},
    "bridge_ack": {"ids"},
    "bridge_profiles": set(),
    "bridge_whoami": set(),
    "bridge_read": {"sessionId", "source"},
    "bridge_cancel": {"sessionId"},
}
REQUIRED = {"bridge_send": ["content"], "bridge_reply": ["content"], "bridge_ask": ["content"],
            "bridge_stop": ["paneId"], "bridge_ack": ["ids"]}


def client(token):
    c = McpClient(token, path=BRIDGE)
    c.initialize()
    return c


def call(c, name, args=None):
    body = c.call(name, args or {}).json()
    return body.get("result"), body.get("error")


@pytest.fixture(autouse=True)
def profiles(db):
    seed_profiles()


def test_exact_tool_surface(mint):
    c = client(mint("alice"))
    r = c.rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                             "clientInfo": {"name": "t", "version": "0"}}).json()["result"]
    assert r["serverInfo"]["name"] == "yuzu-bridge" and "bridge_send" in r["instructions"]
    tools = {t["name"]: t for t in c.rpc("tools/list").json()["result"]["tools"]}
    assert set(tools) == set(SPEC_PARAMS)
    for name, params in SPEC_PARAMS.items():
        t = tools[name]
        assert set(t["inputSchema"]["properties"]) == params, name
        assert t["inputSchema"].get("required", []) == REQUIRED.get(name, []), name
        assert t["outputSchema"]["type"] == "object", name
        assert "approval_id" not in t["inputSchema"]["properties"]
    assert tools["bridge_list"]["annotations"]["readOnlyHint"] is True
    assert tools["bridge_stop"]["annotations"]["idempotentHint"] is True
    # The main catalogue does not carry the bridge's tools.
    v1 = McpClient(mint("alice"))
    v1.initialize()
    assert not [t for t in v1.rpc("tools/list").json()["result"]["tools"] if t["name"].startswith("bridge_")]


def test_malformed_calls_are_invalid_params(mint):
    c = client(mint("alice"))
    for name, args in [("bridge_send", {}), ("bridge_send", {"content": "x", "timeoutMs": "soon"}),
                       ("bridge_send", {"content": "x", "target": "w1"}), ("bridge_stop", {}),
                       ("bridge_ack", {"ids": []}), ("bridge_read", {"source": "everything"}),
                       ("bridge_send", {"content": "x" * 65537})]:
        result, error = call(c, name, args)
        assert result is None and error["code"] == -32602, (name, args, result)
    # 64 KiB is counted in UTF-8 bytes too
    result, error = call(c, "bridge_send", {"content": "é" * 40000, "sessionId": "w0"})
    assert error["code"] == -32602 and "64 KiB" in error["message"]


def test_identity_from_the_token(mint, make_user):
    alice = make_user("alice", "Operator")
    c = client(mint("alice"))
    result, _ = call(c, "bridge_whoami")
    assert result["structuredContent"]["role"] == "primary" and result["structuredContent"]["name"] == "alice"
    # A bridge-audience token linked to no worker is refused as such (not treated as a primary).
    _, raw = ApiToken.mint(alice, "stray", audience="bridge", expires_at=timezone.now() + timedelta(hours=1))
    result, _ = call(client(raw), "bridge_whoami")
    assert result["isError"] and result["structuredContent"]["error"]["code"] == "not_a_worker"
    # The same token is refused outright by /mcp/v1/.
    r = request(body={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
                headers={"authorization": f"Bearer {raw}"})
    assert r.status == 401
    # A worker token linked from a Member: that worker, and nothing but a worker.
    token, raw_w = ApiToken.mint(alice, "w", audience="bridge", expires_at=timezone.now() + timedelta(hours=1))
    m = Member.objects.create(owner=alice, owner_key="u0.tnobody", profile_name="standin", socket_name="x",
                              pane_id="%99", token=token, name="standin-x")
    result, _ = call(client(raw_w), "bridge_whoami")
    assert result["structuredContent"]["role"] == "worker" and result["structuredContent"]["sessionId"] == m.session_id
    # Arguments never change who you are.
    result, _ = call(client(raw_w), "bridge_send", {"content": "hi", "sessionId": m.session_id})
    assert result["structuredContent"]["error"]["code"] == "wrong_role"


def test_a_worker_reaching_for_the_primary_s_tools_is_audited_denied(mint, make_user):
    """A worker's token trying a primary's tool (spawn, stop, read, send, cancel), and a stray bridge token, are
    refusals of who the caller is — audited ``denied`` as the REST face's 403 is, not as a tool's business failure."""
    alice = make_user("alice", "Operator")
    token, raw = ApiToken.mint(alice, "w", audience="bridge", expires_at=timezone.now() + timedelta(hours=1))
    Member.objects.create(owner=alice, owner_key="u0.tnobody", profile_name="standin", socket_name="x",
                          pane_id="%99", token=token, name="standin-x")
    c = client(raw)
    tried = {"bridge_spawn": {}, "bridge_stop": {"paneId": "%1"}, "bridge_read": {}, "bridge_cancel": {},
             "bridge_send": {"content": "hi", "wait": False}}
    for name, args in tried.items():
        result, _ = call(c, name, args)
        assert result["structuredContent"]["error"]["code"] == "wrong_role"
        row = AuditEvent.objects.filter(action=f"mcp.{name}").latest("id")
        assert row.result == "denied", (name, row.result, row.detail)
    _, stray = ApiToken.mint(alice, "stray", audience="bridge", expires_at=timezone.now() + timedelta(hours=1))
    result, _ = call(client(stray), "bridge_list")
    assert result["structuredContent"]["error"]["code"] == "not_a_worker"
    assert AuditEvent.objects.filter(action="mcp.bridge_list").latest("id").result == "denied"
    # A business failure stays a failure.
    primary = client(mint("alice"))
    result, _ = call(primary, "bridge_read", {"sessionId": "nobody"})
    assert result["structuredContent"]["error"]["code"] == "unknown_worker"
    assert AuditEvent.objects.filter(action="mcp.bridge_read").latest("id").result == "failure"


def test_tiers_and_rbac(mint):
    # No tier and supervised: everything, nothing approval-gated.
    for tier in ("", "supervised"):
        result, error = call(client(mint(f"p{tier or 'plain'}", tier=tier)), "bridge_stop", {"paneId": "%1"})
        assert error is None and result["structuredContent"]["wasRunning"] is False, (tier, error)
    # readonly tier: reads only.
    c = client(mint("ro", tier="readonly"))
    assert call(c, "bridge_list")[1] is None
    assert call(c, "bridge_stop", {"paneId": "%1"})[1]["code"] == -32004
    # Viewer role: Bridge:Read only.
    v = client(mint("vic", role="Viewer"))
    assert call(v, "bridge_profiles")[1] is None
    _, error = call(v, "bridge_spawn", {"profile": "standin"})
    assert error["code"] == -32003 and error["data"]["permission"] == "Bridge:Execute"


def test_guard_and_worker_env(make_user, monkeypatch):
    p = Profile.objects.get(name="claude-worker")
    assert not p.spawnable
    with pytest.raises(BridgeFailure) as exc:
        SubscriptionGuard.check_spawn(p)
    assert exc.value.code == "subscription_boundary" and exc.value.status == 403
    p.env = {"ANTHROPIC_BASE_URL": "https://gateway.example/anthropic", "ANTHROPIC_AUTH_TOKEN": "sk-worker"}
    assert p.spawnable
    SubscriptionGuard.check_spawn(p, primary_pane="other-socket:%3", socket_name="yuzu-bridge")
    with pytest.raises(BridgeFailure):
        SubscriptionGuard.check_spawn(p, primary_pane="%3", socket_name="yuzu-bridge")
    # The worker's env: the profile's, never the server's own ANTHROPIC_* (or anything else of it).
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-server")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://server.example")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "nope")
    user = make_user("alice", "Operator")
    m = Member(owner=user, owner_key="u1.t1", profile_name=p.name, socket_name="s")
    env = worker_env(p, m, "yuzu_" + "0" * 64)
    assert env["ANTHROPIC_BASE_URL"] == "https://gateway.example/anthropic"
    assert env["ANTHROPIC_AUTH_TOKEN"] == "sk-worker" and "ANTHROPIC_API_KEY" not in env
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert env["YUZU_BRIDGE_TOKEN"] == "yuzu_" + "0" * 64 and env["YUZU_BRIDGE_SESSION_ID"] == m.session_id
    assert set(env) == {"PATH", "HOME", "LANG", "TERM", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN",
                        "YUZU_BRIDGE_URL", "YUZU_BRIDGE_TOKEN", "YUZU_BRIDGE_SESSION_ID", "YUZU_BRIDGE_EVENTS_URL"} \
        - ({"HOME"} if "HOME" not in env else set())
    # A profile cannot override the bridge's own variables.
    p.env["YUZU_BRIDGE_TOKEN"] = "mine"
    assert worker_env(p, m, "yuzu_x")["YUZU_BRIDGE_TOKEN"] == "yuzu_x"
    # Placeholders: exact tokens only (JSON braces in an argument survive).
    s = Profile.objects.get(name="standin")
    argv = substitute(list(s.argv), s)
    assert argv[0].endswith("python") or "python" in argv[0]
    claude = substitute(list(Profile.objects.get(name="claude-worker").argv), p)
    assert '"Bearer ${YUZU_BRIDGE_TOKEN}"' in claude[2] and claude[-1] == p.system_prompt_addendum


def test_profiles_never_show_env(mint):
    Profile.objects.filter(name="standin").update(env={"SECRET_THING": "s3cr3t"})
    result, _ = call(client(mint("alice")), "bridge_profiles")
    text = result["content"][0]["text"]
    assert "s3cr3t" not in text and "SECRET_THING" not in text
    names = {p["name"]: p for p in result["structuredContent"]["profiles"]}
    assert names["standin"]["spawnable"] and not names["claude-worker"]["spawnable"]


def test_seeding_is_idempotent_and_keeps_edits(db):
    Profile.objects.filter(name="claude-worker").update(env={"ANTHROPIC_BASE_URL": "https://x"})
    assert seed_profiles() == []
    assert Profile.objects.get(name="claude-worker").env == {"ANTHROPIC_BASE_URL": "https://x"}
    Profile.objects.filter(name="standin").delete()
    assert seed_profiles() == ["standin"]


def test_operator_role_holds_bridge_permissions(make_user):
    user = make_user("olga", "Operator")
    grants = Principal(user=user).grants()
    assert {("Bridge", "Read"), ("Bridge", "Write"), ("Bridge", "Execute")} <= set(grants)


def test_a_pane_hint_refusal_says_what_to_fix():
    """An X-Bridge-Pane that names no tmux server is taken to be on the bridge's own (erring safe) and refused; the
    refusal said "the primary's own pane (%3) lives on the bridge's tmux server" — which the bridge had assumed,
    not found — and for a stop only "that pane is the primary's own pane". Now each names the header, what was
    read from it and how to send it (``$TMUX:$TMUX_PANE`` from the primary's pane, or no header outside tmux).
    Messages only: the rule is as it was."""
    member = Member(pane_id="%3", terminal_id="w-1", socket_name="yuzu-bridge")
    for hint, stop in [("%3", False), (":", False), ("%3", True)]:
        with pytest.raises(BridgeFailure) as refused:
            SubscriptionGuard.check_primary_pane(hint, "yuzu-bridge", member if stop else None)
        message = refused.value.message
        assert refused.value.code == "subscription_boundary" and refused.value.status == 403
        assert f"X-Bridge-Pane '{hint}' names no tmux server" in message and "'yuzu-bridge'" in message, message
        assert "X-Bridge-Pane: $TMUX:$TMUX_PANE" in message, message
        assert "leave it out when the primary is not in tmux" in message, message
        assert ("will not close" if stop else "will not manage workers beside") in message, message
    for hint, stop in [("yuzu-bridge:%3", False), ("/tmp/tmux-0/yuzu-bridge,77,0:%3", True)]:
        with pytest.raises(BridgeFailure) as refused:
            SubscriptionGuard.check_primary_pane(hint, "yuzu-bridge", member if stop else None)
        message = refused.value.message
        assert message.startswith(f"X-Bridge-Pane '{hint}' ") and "Run the primary in another tmux server" in message
        assert "names no tmux server" not in message and "X-Bridge-Pane: $TMUX:$TMUX_PANE" in message, message
        assert ("will not close" if stop else "will not manage workers beside") in message, message
    SubscriptionGuard.check_primary_pane("elsewhere:%3", "yuzu-bridge", member)  # not the bridge's server: allowed
