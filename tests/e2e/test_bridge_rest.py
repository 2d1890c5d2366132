"""The bridge's REST face (parity with the tools) and its hook sink, against a real daphne, real tmux
panes and the poller process."""

import httpx
import pytest

from bridge.models import Member, Profile
from bridge.testing.fixtures import needs_tmux, spawn_standin, status_of
from bridge.testing.harness import wait_until

pytestmark = [pytest.mark.live, needs_tmux]


def rest(bridge, method, path, token, headers=None, **kw):
    return httpx.request(method, bridge.api + path, headers={"Authorization": f"Bearer {token}", **(headers or {})},
                         trust_env=False, timeout=30, **kw)


def worker_token(bridge, pane_id):
    from bridge.testing.fixtures import pane_env

    env = pane_env(bridge, pane_id)
    return env["YUZU_BRIDGE_TOKEN"], env["YUZU_BRIDGE_EVENTS_URL"]


def test_rest_members_parity(bridge, primary, mint):
    token = mint("dave", role="Operator")
    r = rest(bridge, "POST", "/bridge/members", token, json={"profile": "standin"})
    assert r.status_code == 201, r.text
    w = r.json()["data"]
    assert w["profile"] == "standin" and w["paneId"].startswith("%")
    listed = rest(bridge, "GET", "/bridge/members", token).json()
    assert [x["sessionId"] for x in listed["data"]] == [w["sessionId"]] and listed["meta"]["count"] == 1
    assert listed["data"][0]["queueDepth"] == 0
    # Same token on MCP: same primary, same world.
    from bridge.testing.harness import Mcp

    mcp = Mcp(bridge.bridge_url, token)
    try:
        assert [x["sessionId"] for x in mcp.call("bridge_list", {})["workers"]] == [w["sessionId"]]
    finally:
        mcp.close()
    # Another primary sees nothing and cannot stop it.
    other = mint("erin", role="Operator")
    assert rest(bridge, "GET", "/bridge/members", other).json()["data"] == []
    assert rest(bridge, "DELETE", f"/bridge/members/{w['sessionId']}", other).json()["data"]["wasRunning"] is False
    # DELETE is idempotent (a paneId such as %3 travels URL-encoded).
    pane = w["paneId"].replace("%", "%25")
    first = rest(bridge, "DELETE", f"/bridge/members/{pane}", token)
    assert first.status_code == 200 and first.json()["data"]["wasRunning"] is True, first.text
    again = rest(bridge, "DELETE", f"/bridge/members/{pane}", token)
    assert again.status_code == 200 and again.json()["data"]["wasRunning"] is False
    assert rest(bridge, "GET", "/bridge/members", token).json()["data"] == []


def test_rest_rbac_and_guard(bridge, mint):
    Profile.objects.update(is_default=False)  # as seeded on a host with Claude Code's CLI
    Profile.objects.filter(name="claude-worker").update(is_default=True)
    viewer = mint("vic", role="Viewer")
    assert rest(bridge, "GET", "/bridge/members", viewer).status_code == 200  # Bridge:Read
    r = rest(bridge, "POST", "/bridge/members", viewer, json={"profile": "standin"})
    assert r.status_code == 403 and r.json()["error"]["permission"] == "Bridge:Execute"
    op = mint("olga", role="Operator")
    r = rest(bridge, "POST", "/bridge/members", op, json={})  # the default profile: claude-worker, unconfigured
    assert r.status_code == 403 and r.json()["error"]["reason"] == "subscription_boundary"
    r = rest(bridge, "POST", "/bridge/members", op, json={"profile": "nope"})
    assert r.status_code == 404 and r.json()["error"]["reason"] == "unknown_profile"
    # A primary that declares its own pane on the bridge's tmux server is refused too.
    r = rest(bridge, "POST", "/bridge/members", op, json={"profile": "standin"},
             headers={"X-Bridge-Pane": f"{bridge.socket_name}:%0"})
    assert r.status_code == 403 and r.json()["error"]["reason"] == "subscription_boundary"
    assert Member.objects.count() == 0
    r = rest(bridge, "POST", "/bridge/members", op, json={"profile": "standin"},
             headers={"X-Bridge-Pane": "default:%0"})
    assert r.status_code == 201


def test_hook_sink_drives_status(bridge, primary, mint):
    """Hooks are the most trusted status source: a pane whose screen says nothing (UNKNOWN) gets its
    message once a hook reports IDLE, counts the pickup on UserPromptSubmit and ends its turn on Stop
    (turn_done fallback with the terminal tail, here the tty's echo of the pasted text)."""
    Profile.objects.create(name="mute", agent_kind="standin", requires_api_base_url=False,
                           argv=["{python}", "-c", "import time; time.sleep(600)"])
    p = primary()
    w = spawn_standin(p, "mute")
    token, events_url = worker_token(bridge, w["paneId"])
    assert events_url == f"{bridge.api}/bridge/members/{w['sessionId']}/events"

    def hook(event, tok=token, **payload):
        return httpx.post(events_url, json={"hook_event_name": event, **payload},
                          headers={"Authorization": f"Bearer {tok}"}, trust_env=False, timeout=10)

    sent = p.call("bridge_send", {"content": "hello hooks", "sessionId": w["sessionId"], "wait": False})
    wait_until(lambda: status_of(p, w["sessionId"])["agent_status"] == "UNKNOWN", 10)
    assert status_of(p, w["sessionId"])["queueDepth"] == 1
    r = hook("SessionStart", source="startup")
    assert r.status_code == 200 and r.json()["data"]["status"] == "IDLE", r.text
    wait_until(lambda: Member.objects.get(session_id=w["sessionId"]).last_delivered_at is not None, 10,
               what="delivery after the IDLE hook")
    assert hook("UserPromptSubmit").json()["data"]["status"] == "WORKING"
    wait_until(lambda: status_of(p, w["sessionId"])["agent_status"] == "WORKING", 10)
    assert hook("Stop").json()["data"]["status"] == "IDLE"
    items = p.call("bridge_poll", {"timeoutMs": 10000})["items"]
    assert len(items) == 1 and items[0]["outcome"] == "turn_done" and items[0]["turnId"] == sent["dispatchId"]
    assert "hello hooks" in items[0]["text"]
    # Only the worker's own token posts its events: a primary token is refused (wrong audience), and
    # another worker's token cannot speak for this one.
    assert hook("Stop", tok=p.token).status_code == 401
    w2 = spawn_standin(p, "mute")
    token2, _ = worker_token(bridge, w2["paneId"])
    assert hook("Stop", tok=token2).status_code == 404
    assert hook("Nonsense").json()["data"]["status"] is None
