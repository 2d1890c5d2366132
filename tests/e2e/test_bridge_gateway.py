"""The bridge end to end (docs/bridge.md, spec §4 flows): real tmux panes running the stand-in agent,
a real daphne serving /mcp/bridge/, and the StatusPoller/Injector as its own process — the same
shape as `make run`. Calls go through the MCP endpoint as raw JSON-RPC (the official client drives
the delegation flow in tests/e2e/test_bridge_official_client.py)."""

import threading
import time

import httpx
import pytest

from bridge.models import InboxItem, Member, Message, Profile, Turn
from bridge.testing.fixtures import (
    SERVER_SECRET,
    needs_tmux,
    pane_env,
    spawn_standin,
    status_of,
    wait_status,
)
from bridge.testing.harness import Mcp, wait_until

pytestmark = [pytest.mark.live, needs_tmux]


def test_delegation_reply(primary, bridge):
    p = primary()
    w = spawn_standin(p)
    assert w["profile"] == "standin" and w["paneId"].startswith("%") and w["sessionId"]
    t0 = time.monotonic()
    r = p.call("bridge_send", {"content": "reply:the answer is 42", "sessionId": w["sessionId"], "timeoutMs": 20000})
    assert not r.is_error, (r.structured, bridge.logs())
    assert r["outcome"] == "reply" and r["text"] == "the answer is 42" and r["turnId"], r.structured
    assert time.monotonic() - t0 < 15
    turn = Turn.objects.get(turn_id=r["turnId"])
    assert turn.state == Turn.State.REPLIED and turn.pending is None
    assert Message.objects.get(turn=turn).state in (Message.State.DELIVERED, Message.State.PICKED_UP)
    from yuzu.models import AuditEvent

    actions = set(AuditEvent.objects.filter(action__startswith="bridge.").values_list("action", flat=True))
    assert {"bridge.spawn", "bridge.send", "bridge.reply"} <= actions
    assert AuditEvent.objects.filter(action="mcp.bridge_send", result="success").exists()


def test_clarification_ask_answer_reply(primary, bridge):
    p = primary()
    w = spawn_standin(p)
    r = p.call("bridge_send", {"content": "ask:which config?", "sessionId": w["sessionId"], "timeoutMs": 20000})
    assert not r.is_error, (r.structured, bridge.logs())
    assert r["outcome"] == "question" and r["text"] == "which config?", r.structured
    turn_id = r["turnId"]
    # The worker is blocked in bridge_ask (a busy turn): nothing new is injected meanwhile.
    assert status_of(p, w["sessionId"])["rendezvousOpen"] is True
    r2 = p.call("bridge_send", {"content": "config.yaml", "sessionId": w["sessionId"], "turnId": turn_id,
                                "timeoutMs": 20000})
    assert not r2.is_error, r2.structured
    assert r2.structured == {"outcome": "reply", "text": "answered:config.yaml", "turnId": turn_id,
                             "sessionId": w["sessionId"]}
    # Answering a question that is no longer open is refused, not silently queued.
    r3 = p.call("bridge_send", {"content": "again", "turnId": turn_id, "timeoutMs": 1000})
    assert r3.is_error and r3.error_code == "no_question"


def test_detached_delivery_poll_until_ack(primary, bridge):
    p = primary()
    w = spawn_standin(p)
    r = p.call("bridge_send", {"content": "reply:detached result", "sessionId": w["sessionId"], "wait": False})
    assert r["outcome"] == "dispatched" and r["dispatchId"], r.structured
    got = p.call("bridge_poll", {"timeoutMs": 20000})
    assert got["count"] == 1, (got.structured, bridge.logs())
    item = got["items"][0]
    assert item["kind"] == "reply" and item["outcome"] == "reply" and item["text"] == "detached result"
    assert item["turnId"] == r["dispatchId"] and item["sessionId"] == w["sessionId"]
    # At-least-once: returned again until acknowledged.
    again = p.call("bridge_poll", {})
    assert [i["id"] for i in again["items"]] == [item["id"]]
    assert p.call("bridge_status", {})["pending"] == 1
    acked = p.call("bridge_ack", {"ids": [item["id"], "i-not-mine"]})
    assert acked.structured == {"acked": [item["id"]], "unknown": ["i-not-mine"]}
    assert p.call("bridge_poll", {})["count"] == 0
    assert p.call("bridge_ack", {"ids": [item["id"]]})["acked"] == [item["id"]]  # acking twice is harmless


def test_turn_done_fallback_returns_terminal_tail(primary, bridge):
    p = primary()
    w = spawn_standin(p)
    r = p.call("bridge_send", {"content": "done", "sessionId": w["sessionId"], "timeoutMs": 20000})
    assert not r.is_error, (r.structured, bridge.logs())
    assert r["outcome"] == "turn_done", r.structured
    assert "turn done (no reply)" in r["text"]
    assert Turn.objects.get(turn_id=r["turnId"]).state == Turn.State.TURN_DONE


def test_timeout_then_late_reply_lands_in_poll(primary, bridge):
    Profile.objects.create(name="slow-standin", agent_kind="standin", requires_api_base_url=False,
                           argv=["{python}", "-m", "bridge.testing.standin"], cwd="{repo}",
                           env={"YUZU_STANDIN_BUSY_SECONDS": "2.5"})
    p = primary()
    w = spawn_standin(p, "slow-standin")
    r = p.call("bridge_send", {"content": "reply:worth the wait", "sessionId": w["sessionId"], "timeoutMs": 600})
    assert r.structured == {"outcome": "timeout", "turnId": r["turnId"], "sessionId": w["sessionId"]}
    late = p.call("bridge_poll", {"timeoutMs": 20000})
    assert late["count"] == 1, (late.structured, bridge.logs())
    item = late["items"][0]
    assert (item["kind"], item["text"], item["turnId"]) == ("reply", "worth the wait", r["turnId"])
    time.sleep(0.3)
    assert [i["id"] for i in p.call("bridge_poll", {})["items"]] == [item["id"]]  # still there until acked
    p.call("bridge_ack", {"ids": [item["id"]]})
    assert p.call("bridge_poll", {})["count"] == 0


def test_worker_gone_mid_wait(primary, bridge):
    p = primary()
    w = spawn_standin(p)
    r = p.call("bridge_send", {"content": "exit", "sessionId": w["sessionId"], "timeoutMs": 20000})
    assert r.is_error, r.structured
    assert r.structured["error"]["code"] == "worker_gone" and r.structured["error"]["retryable"] is False
    m = Member.objects.get(session_id=w["sessionId"])
    assert m.stopped_at is not None and m.status == "GONE"
    assert m.token.revoked_at is not None
    # A later send to it fails the same way, and the list no longer shows it.
    again = p.call("bridge_send", {"content": "hello?", "sessionId": w["sessionId"], "timeoutMs": 1000})
    assert again.error_code == "worker_gone"
    assert p.call("bridge_list", {})["count"] == 0


def test_stop_is_idempotent_and_fails_waiters(primary, bridge):
    p = primary()
    w = spawn_standin(p)
    sent = p.call("bridge_send", {"content": "stall", "sessionId": w["sessionId"], "wait": False})
    turn_id = sent["dispatchId"]
    wait_status(p, w["sessionId"], {"WORKING"})
    results, other = {}, Mcp(bridge.bridge_url, p.token)  # a second connection of the same primary
    waiter = threading.Thread(target=lambda: results.update(r=other.call(
        "bridge_send", {"content": "queued behind the stall", "sessionId": w["sessionId"], "timeoutMs": 20000})))
    waiter.start()
    wait_until(lambda: Message.objects.filter(member__session_id=w["sessionId"], state="queued").exists(), 5)
    first = p.call("bridge_stop", {"paneId": w["paneId"]})
    assert first.structured == {"paneId": w["paneId"], "sessionId": w["sessionId"], "stopped": True,
                                "wasRunning": True}
    waiter.join(15)
    assert results["r"].error_code == "worker_gone", results["r"].structured
    assert p.call("bridge_stop", {"paneId": w["paneId"]})["wasRunning"] is False
    states = dict(Message.objects.filter(member__session_id=w["sessionId"]).values_list("content", "state"))
    assert states == {"stall": "picked_up", "queued behind the stall": "failed"}
    # The detached turn's failure is not lost either: it waits in the inbox.
    items = p.call("bridge_poll", {})["items"]
    assert any(i["kind"] == "error" and i["turnId"] == turn_id and i["error"]["code"] == "worker_gone" for i in items)
    assert w["paneId"] not in [x.pane_id for x in bridge.backend().list_panes()]


def test_never_injected_while_working(primary, bridge):
    p = primary()
    w = spawn_standin(p)
    p.call("bridge_send", {"content": "stall", "sessionId": w["sessionId"], "wait": False})
    wait_status(p, w["sessionId"], {"WORKING"})
    r = p.call("bridge_send", {"content": "reply:must wait", "sessionId": w["sessionId"], "timeoutMs": 1500})
    assert r["outcome"] == "timeout"
    assert Message.objects.get(turn__turn_id=r["turnId"]).state == Message.State.QUEUED
    st = status_of(p, w["sessionId"])
    assert st["agent_status"] == "WORKING" and st["queueDepth"] == 1
    screen = p.call("bridge_read", {"sessionId": w["sessionId"], "source": "visible"})["text"]
    assert "must wait" not in screen


def test_never_injected_while_unknown(primary, bridge):
    Profile.objects.create(name="mute", agent_kind="standin", requires_api_base_url=False,
                           argv=["{python}", "-c", "import time; time.sleep(600)"])
    p = primary()
    w = spawn_standin(p, "mute")
    r = p.call("bridge_send", {"content": "hello there", "sessionId": w["sessionId"], "timeoutMs": 1500})
    assert r["outcome"] == "timeout"
    assert Message.objects.get(turn__turn_id=r["turnId"]).state == Message.State.QUEUED
    assert status_of(p, w["sessionId"])["agent_status"] == "UNKNOWN"
    detection = p.call("bridge_read", {"sessionId": w["sessionId"], "source": "detection"})["detection"]
    assert detection["status"] == "UNKNOWN"
    assert "hello there" not in p.call("bridge_read", {"sessionId": w["sessionId"], "source": "visible"})["text"]


def test_multiline_message_is_one_turn(primary, bridge):
    p = primary()
    w = spawn_standin(p)
    text = "first line\nsecond line\n\n  indented third; with a semicolon;"
    r = p.call("bridge_send", {"content": text, "sessionId": w["sessionId"], "timeoutMs": 20000})
    assert r["outcome"] == "reply" and r["text"] == "echo:" + text, (r.structured, bridge.logs())
    # One turn, one message: nothing else was queued or replied.
    assert Turn.objects.filter(member__session_id=w["sessionId"]).count() == 1
    assert InboxItem.objects.count() == 0


def test_control_characters_are_refused_before_anything_is_queued(primary, bridge):
    """ESC[201~ would end the worker's bracketed paste and have the rest typed as keystrokes (here Shift-Tab,
    then "2" and Enter): bridge_send, bridge_reply and bridge_ask refuse control characters up front."""
    p = primary()
    w = spawn_standin(p)
    hostile = "reply:fine\x1b[201~\x1b[Z2\r"
    r = p.call("bridge_send", {"content": hostile, "sessionId": w["sessionId"], "timeoutMs": 2000})
    assert r.rpc_error and r.rpc_error["code"] == -32602, (r.structured, r.rpc_error)
    assert "U+001B at offset 10" in r.rpc_error["message"]
    assert not Message.objects.exists() and not Turn.objects.exists()
    worker = Mcp(bridge.bridge_url, pane_env(bridge, w["paneId"])["YUZU_BRIDGE_TOKEN"])
    try:
        for tool, ch in (("bridge_reply", "\x9b"), ("bridge_ask", "\x7f"), ("bridge_reply", "\x00")):
            r = worker.call(tool, {"content": f"looks harmless{ch}31m"})
            assert r.rpc_error and r.rpc_error["code"] == -32602, (tool, r.structured)
            assert f"U+{ord(ch):04X} at offset 14" in r.rpc_error["message"]
    finally:
        worker.close()
    assert not Turn.objects.exists() and InboxItem.objects.count() == 0
    # Tabs and newlines are plain text and still go through, as one paste.
    text = "col 1\tcol 2\nsecond line"
    r = p.call("bridge_send", {"content": text, "sessionId": w["sessionId"], "timeoutMs": 20000})
    assert r["outcome"] == "reply" and r["text"] == "echo:" + text, (r.structured, bridge.logs())


def test_auto_spawn_default_worker_and_whoami(primary, bridge):
    Profile.objects.update(is_default=False)
    Profile.objects.filter(name="standin").update(is_default=True)
    p = primary()
    assert p.call("bridge_list", {})["count"] == 0
    r = p.call("bridge_send", {"content": "reply:spawned for you", "timeoutMs": 20000})
    assert r["outcome"] == "reply" and r["text"] == "spawned for you", (r.structured, bridge.logs())
    workers = p.call("bridge_list", {})["workers"]
    assert [x["sessionId"] for x in workers] == [r["sessionId"]] and workers[0]["profile"] == "standin"
    me = p.call("bridge_whoami", {}).structured
    assert me["role"] == "primary" and me["name"] == "alice"
    # autoSpawn:false with a second default-less situation: addressing by profile name works too.
    r2 = p.call("bridge_send", {"content": "reply:by profile", "sessionId": "standin", "timeoutMs": 20000,
                                "autoSpawn": False})
    assert r2["text"] == "by profile" and r2["sessionId"] == r["sessionId"]


def test_worker_identity_env_and_token_audience(primary, bridge):
    p = primary()
    w = spawn_standin(p)
    env = pane_env(bridge, w["paneId"])
    # The worker's environment: the profile's, PATH/HOME/LANG/TERM and the bridge's own variables only.
    assert not [k for k in env if k.startswith("ANTHROPIC_")], env.keys()
    assert SERVER_SECRET not in "".join(env.values())
    assert env["YUZU_BRIDGE_URL"] == bridge.bridge_url and env["YUZU_BRIDGE_SESSION_ID"] == w["sessionId"]
    assert set(env) <= {"PATH", "HOME", "LANG", "TERM", "YUZU_STANDIN_BUSY_SECONDS", "YUZU_BRIDGE_URL",
                        "YUZU_BRIDGE_TOKEN", "YUZU_BRIDGE_SESSION_ID", "YUZU_BRIDGE_EVENTS_URL"}
    token = env["YUZU_BRIDGE_TOKEN"]
    worker = Mcp(bridge.bridge_url, token)
    try:
        me = worker.call("bridge_whoami", {}).structured
        assert me == {"role": "worker", "sessionId": w["sessionId"], "paneId": w["paneId"],
                      "terminalId": w["terminalId"], "profile": "standin", "name": w["name"], "primary": "alice"}
        # A worker sees its own primary's world, and may not act as a primary.
        assert [x["sessionId"] for x in worker.call("bridge_list", {})["workers"]] == [w["sessionId"]]
        assert worker.call("bridge_send", {"content": "hi", "timeoutMs": 100}).error_code == "wrong_role"
        assert worker.call("bridge_spawn", {}).error_code == "wrong_role"
        assert p.call("bridge_reply", {"content": "x"}).error_code == "wrong_role"
        # Spontaneous reply (no turn): not an error, queued for the primary.
        assert worker.call("bridge_reply", {"content": "fyi"}).structured["mode"] == "queued"
        assert [i["text"] for i in p.call("bridge_poll", {})["items"]] == ["fyi"]
    finally:
        worker.close()
    # The worker token is refused by the main MCP endpoint and the REST API (audience "bridge").
    for url in (bridge.base + "/mcp/v1/", bridge.api + "/bridge/members"):
        r = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
                       headers={"Authorization": f"Bearer {token}"}, trust_env=False)
        assert r.status_code == 401, (url, r.text)
    # The token dies with the worker.
    p.call("bridge_stop", {"paneId": w["sessionId"]})
    r = Mcp(bridge.bridge_url, token).initialize()
    assert r.status_code == 401


def test_two_primaries_are_isolated(primary, bridge):
    alice, bob = primary("alice"), primary("bob")
    wa = spawn_standin(alice)
    assert bob.call("bridge_list", {})["count"] == 0
    assert bob.call("bridge_status", {"sessionId": wa["sessionId"]}).error_code == "unknown_worker"
    for ident in (wa["sessionId"], wa["paneId"]):
        r = bob.call("bridge_send", {"content": "reply:stolen", "sessionId": ident, "timeoutMs": 500,
                                     "autoSpawn": False})
        assert r.error_code == "unknown_worker", r.structured
        assert bob.call("bridge_read", {"sessionId": ident}).error_code == "unknown_worker"
        assert bob.call("bridge_cancel", {"sessionId": ident}).error_code == "unknown_worker"
    assert bob.call("bridge_stop", {"paneId": wa["paneId"]})["wasRunning"] is False
    assert Member.objects.get(session_id=wa["sessionId"]).live
    # Bob's own worker never answers Alice, and Alice's inbox is hers alone.
    wb = spawn_standin(bob)
    assert bob.call("bridge_send", {"content": "reply:bob's", "sessionId": wb["sessionId"], "timeoutMs": 20000})["text"] == "bob's"
    alice.call("bridge_send", {"content": "reply:alice's", "sessionId": wa["sessionId"], "wait": False})
    items = alice.call("bridge_poll", {"timeoutMs": 20000})["items"]
    assert [i["text"] for i in items] == ["alice's"]
    assert bob.call("bridge_poll", {})["count"] == 0
    assert bob.call("bridge_ack", {"ids": [items[0]["id"]]}).structured == {"acked": [], "unknown": [items[0]["id"]]}
    assert [x["sessionId"] for x in alice.call("bridge_list", {})["workers"]] == [wa["sessionId"]]


def test_subscription_guard_refuses_claude_worker_without_base_url(primary, bridge, mint):
    Profile.objects.update(is_default=False)  # as seeded on a host with Claude Code's CLI
    Profile.objects.filter(name="claude-worker").update(is_default=True)
    p = primary()
    r = p.call("bridge_spawn", {"profile": "claude-worker"})
    assert r.is_error and r.structured["error"]["code"] == "subscription_boundary", r.structured
    assert "ANTHROPIC_BASE_URL" in r.structured["error"]["message"]
    # auto-spawn of the (unconfigured) default profile is refused the same way
    r = p.call("bridge_send", {"content": "hello", "timeoutMs": 500})
    assert r.error_code == "subscription_boundary"
    profiles = {x["name"]: x for x in p.call("bridge_profiles", {})["profiles"]}
    assert profiles["claude-worker"]["spawnable"] is False and profiles["claude-worker"]["default"] is True
    assert profiles["standin"]["spawnable"] is True
    assert "env" not in profiles["claude-worker"]
    # REST parity: 403 with the same reason
    token = mint("carol", role="Operator")
    resp = httpx.post(bridge.api + "/bridge/members", json={"profile": "claude-worker"},
                      headers={"Authorization": f"Bearer {token}"}, trust_env=False)
    assert resp.status_code == 403 and resp.json()["error"]["reason"] == "subscription_boundary", resp.text
    assert Member.objects.count() == 0
    # A stand-in flag on a non-stand-in profile does not exempt it.
    Profile.objects.filter(name="claude-worker").update(requires_api_base_url=False)
    assert p.call("bridge_spawn", {"profile": "claude-worker"}).error_code == "subscription_boundary"


def test_cancel_abandons_the_rendezvous(primary, bridge):
    p = primary()
    w = spawn_standin(p)
    results, other = {}, Mcp(bridge.bridge_url, p.token)
    waiter = threading.Thread(target=lambda: results.update(r=other.call(
        "bridge_send", {"content": "stall", "sessionId": w["sessionId"], "timeoutMs": 20000})))
    waiter.start()
    wait_status(p, w["sessionId"], {"WORKING"})
    c = p.call("bridge_cancel", {"sessionId": w["sessionId"]})
    assert c["cancelled"] is True and c["interrupted"] is True, c.structured
    waiter.join(10)
    assert results["r"].structured == {"outcome": "cancelled", "turnId": c["turnId"], "sessionId": w["sessionId"]}
    assert p.call("bridge_cancel", {"sessionId": w["sessionId"]})["cancelled"] is False
