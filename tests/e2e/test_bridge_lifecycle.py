"""A worker's lifecycle against its tokens (docs/bridge.md, "Who owns a worker, and for how long"): real tmux panes
running the stand-in, a real daphne and the poller process, as in tests/e2e/test_bridge_gateway.py.

* Rotating the primary's token hands its workers, their open turns and its unacknowledged inbox to the successor —
  at the successor's first bridge call, or at the poller's next sweep — instead of leaving them under the old token
  (unreachable from the new one) until it retires and then stopping them.
* A worker whose own token expired is stopped by the poller (pane closed, queue failed, audited), and the primary
  sees why.
* A revoked primary's workers are stopped; a primary's MCP session ending stops nothing (its token is the primary).
"""

import time

import httpx
import pytest

from bridge.models import InboxItem, Member, Turn
from bridge.testing.fixtures import needs_tmux, spawn_standin, wait_status
from bridge.testing.harness import Mcp, wait_until
from yuzu.models import ApiToken, AuditEvent
from yuzu.rbac import Principal

pytestmark = [pytest.mark.live, needs_tmux]


def token_of(p):
    return next(t for t in ApiToken.objects.filter(audience="api") if t.prefix == p.token[:12])


def rest(bridge, method, path, raw, **kw):
    with httpx.Client(trust_env=False, timeout=10) as http:
        return http.request(method, bridge.api + path, headers={"Authorization": f"Bearer {raw}"}, **kw)


def rotate(bridge, p):
    r = rest(bridge, "POST", f"/tokens/{token_of(p).pk}/rotate", p.token, json={"overlap_secs": 3600})
    assert r.status_code == 201, r.text
    return r.json()["data"]


def spawn(p):
    """A stand-in worker, once the poller sees it IDLE (the poller process may start slowly on a loaded host)."""
    w = spawn_standin(p)
    wait_status(p, w["sessionId"], {"IDLE"}, timeout=60)
    return w


def panes(bridge):
    return {x.pane_id for x in bridge.backend().list_panes()}


def test_rotation_hands_the_workers_to_the_successor(primary, bridge):
    p = primary()
    w = spawn(p)
    asked = p.call("bridge_send", {"content": "ask:which config?", "sessionId": w["sessionId"], "wait": False})
    question = p.call("bridge_poll", {"timeoutMs": 20000})
    assert question["count"] == 1 and question["items"][0]["kind"] == "question", (question.structured,
                                                                                    bridge.logs())
    successor = rotate(bridge, p)
    p2 = Mcp(bridge.bridge_url, successor["token"])
    try:
        listed = p2.call("bridge_list", {})
        assert [x["sessionId"] for x in listed["workers"]] == [w["sessionId"]], \
            "the rotated token's successor does not see the workers its predecessor spawned"
        # the unacknowledged question came along, and the successor answers it on the same turn
        items = p2.call("bridge_poll", {})["items"]
        assert [i["turnId"] for i in items] == [asked["dispatchId"]]
        answered = p2.call("bridge_send", {"content": "config.yaml", "turnId": asked["dispatchId"],
                                           "sessionId": w["sessionId"], "timeoutMs": 20000})
        assert answered.structured == {"outcome": "reply", "text": "answered:config.yaml",
                                       "turnId": asked["dispatchId"], "sessionId": w["sessionId"]}
        # the predecessor (live for its overlap) owns nothing any more
        assert p.call("bridge_list", {})["count"] == 0
        assert AuditEvent.objects.filter(action="bridge.handover", target_id=w["sessionId"],
                                         detail__contains=f"to={successor['id']}").exists()
        # retiring the predecessor stops nothing: the workers are the successor's now
        r = rest(bridge, "POST", f"/tokens/{successor['id']}/confirm", successor["token"])
        assert r.status_code == 200, r.text
        time.sleep(3)  # the poller's orphan sweep runs every 2 s
        assert Member.objects.get(session_id=w["sessionId"]).live
        assert p2.call("bridge_send", {"content": "reply:still here", "sessionId": w["sessionId"],
                                       "timeoutMs": 20000})["text"] == "still here"
    finally:
        p2.close()


def test_a_predecessor_retired_before_its_successor_called_hands_over_at_the_sweep(primary, bridge):
    p = primary()
    w = spawn(p)
    p.call("bridge_send", {"content": "reply:kept for later", "sessionId": w["sessionId"], "wait": False})
    wait_until(lambda: InboxItem.objects.filter(payload__text="kept for later").exists(), 20, what="the reply")
    successor = rotate(bridge, p)
    ApiToken.objects.filter(pk=token_of(p).pk).update(revoked_at=ApiToken.objects.get(pk=successor["id"]).created_at)
    new_key = Principal.key_for(token_of(p).owner_id, successor["id"])
    wait_until(lambda: Member.objects.filter(session_id=w["sessionId"], owner_key=new_key).exists(), 30,
               what="the poller to hand the worker over")
    m = Member.objects.get(session_id=w["sessionId"])
    assert m.live, m.stop_reason
    assert InboxItem.objects.get(payload__text="kept for later").recipient_key == new_key
    # recorded in the handover's own transaction (CI on 159efa8 once read the move before its row)
    assert AuditEvent.objects.filter(principal="system", action="bridge.handover", target_id=w["sessionId"]).exists()
    p2 = Mcp(bridge.bridge_url, successor["token"])
    try:
        assert p2.call("bridge_poll", {})["items"][0]["text"] == "kept for later"
    finally:
        p2.close()


def test_a_worker_whose_token_expired_is_stopped(primary, bridge):
    p = primary()
    w = spawn(p)
    sent = p.call("bridge_send", {"content": "stall", "sessionId": w["sessionId"], "wait": False})
    wait_status(p, w["sessionId"], {"WORKING"})
    m = Member.objects.get(session_id=w["sessionId"])
    ApiToken.objects.filter(pk=m.token_id).update(expires_at=m.created_at)
    wait_until(lambda: not Member.objects.get(pk=m.pk).live, 10, what="the poller to stop the expired worker")
    m.refresh_from_db()
    assert "expired" in m.stop_reason and m.status == "GONE"
    wait_until(lambda: w["paneId"] not in panes(bridge), 5, what="its pane to close")
    view = p.call("bridge_status", {"sessionId": w["sessionId"]})["workers"][0]
    assert view["live"] is False and "expired" in view["stopReason"]
    gone = p.call("bridge_poll", {})["items"]
    assert [(i["turnId"], i["error"]["code"]) for i in gone] == [(sent["dispatchId"], "worker_gone")]
    assert Turn.objects.get(turn_id=sent["dispatchId"]).state == Turn.State.GONE
    assert AuditEvent.objects.filter(principal="system", action="bridge.stop", target_id=w["sessionId"],
                                     detail__contains="reason=worker_token_expired").count() == 1


def test_a_revoked_primary_s_workers_are_stopped(primary, bridge):
    p = primary()
    w = spawn(p)
    r = rest(bridge, "DELETE", f"/tokens/{token_of(p).pk}", p.token)
    assert r.status_code == 200, r.text
    wait_until(lambda: not Member.objects.get(session_id=w["sessionId"]).live, 10, what="the poller to stop it")
    wait_until(lambda: w["paneId"] not in panes(bridge), 5, what="its pane to close")
    assert Member.objects.get(session_id=w["sessionId"]).token.revoked_at is not None
    assert AuditEvent.objects.filter(principal="system", action="bridge.stop", target_id=w["sessionId"],
                                     detail__contains="reason=primary_revoked").count() == 1


def test_the_primary_s_session_ending_stops_nothing(primary, bridge):
    """The primary is its token, not its MCP session: a Claude Code restart (a new session) finds its workers."""
    p = primary()
    w = spawn(p)
    with httpx.Client(trust_env=False, timeout=10) as http:
        r = http.delete(bridge.bridge_url, headers=p.headers())
    assert r.status_code in (200, 204), r.text
    time.sleep(2.5)  # a poller sweep
    again = Mcp(bridge.bridge_url, p.token)
    try:
        assert [x["sessionId"] for x in again.call("bridge_list", {})["workers"]] == [w["sessionId"]]
        assert again.call("bridge_send", {"content": "reply:back", "sessionId": w["sessionId"],
                                          "timeoutMs": 20000})["text"] == "back"
    finally:
        again.close()
