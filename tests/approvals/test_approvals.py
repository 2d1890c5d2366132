"""Approval-gated MCP calls, ticket-then-recall (spec/yuzu-mcp.md §3, docs/approvals.md): mint, dedup,
caps, review over REST and in the admin, recall, the one-time consume under concurrency, expiry and every
refusal message of the gate. Runs on SQLite and PostgreSQL (YUZU_DATABASE_URL)."""

import html
import json
import re
import threading
import time
from datetime import timedelta
from functools import partial

import pytest
from django.db import DatabaseError, connections
from django.db.models import F
from django.test import Client
from django.utils import timezone
from prometheus_client import REGISTRY

from approvals.gate import (
    ALREADY_USED,
    EXPIRED_APPROVED,
    MISMATCH,
    PRECONDITION,
    REMEDIATION,
    canonical_args,
)
from approvals.models import APPROVAL_LIFETIME, Approval
from approvals.services import withdraw
from fleet.models import Agent, Tag
from mcp.pipeline import approval_gate, set_approval_gate
from mcp.registry import catalogue
from tests.support.approvals import PASSWORD, approve, approver_principal, error_of, result_of
from tests.support.mcp_http import McpClient, request
from tests.support.otp import code, next_code
from tests.support.races import at_once
from yuzu.auth import MFA_SESSION_KEY
from yuzu.models import ApiToken, AuditEvent, Role, RoleAssignment, TOTPDevice
from yuzu.rbac import Principal

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("release_worker_connections")]

HEX32 = re.compile(r"^[0-9a-f]{32}$")
CID = re.compile(r"^req-[0-9a-f]+-[0-9a-f]+$")
ARGS = {"agent_id": "host-1", "key": "owner"}
CANONICAL = '{"agent_id":"host-1","key":"owner"}'


# --- fixtures and helpers ----------------------------------------------------------------------


@pytest.fixture
def tagged_agent(db):
    agent = Agent.objects.create(agent_id="host-1", hostname="host-1")
    Tag.objects.create(agent=agent, key="owner", value="payments")
    Tag.objects.create(agent=agent, key="other", value="x")
    return agent


def mint_ticket(client, args=ARGS, tool="delete_tag"):
    err = error_of(client.call(tool, args))
    assert err["code"] == -32006, err
    return err["data"]["approval_id"]


def audits(action="mcp.delete_tag", **kw):
    return list(AuditEvent.objects.filter(action=action, **kw).order_by("id"))


def burned(tool="delete_tag", reason="rbac_denied"):
    return REGISTRY.get_sample_value("yuzu_mcp_approval_burned_total", {"tool": tool, "reason": reason}) or 0.0


def backdate(approval_id, by):
    Approval.objects.filter(pk=approval_id).update(submitted_at=F("submitted_at") - by)


def admin_client(user, device):
    c = Client()
    r = c.post("/admin/login/?next=/admin/", {"username": user.username, "password": PASSWORD,
                                              "otp_device": device.persistent_id, "otp_token": code(device)})
    assert r.status_code == 302, r.content[:500]
    return c


def page_text(resp):
    """The page as a person reads it (the admin capitalises the first letter of a message)."""
    return html.unescape(resp.content.decode()).lower()


def make_stale(c):
    s = c.session
    s[MFA_SESSION_KEY] = time.time() - 3600
    s.save()


# --- 1. mint: the -32006 envelope, the ticket, dedup, audit ------------------------------------

def test_first_call_mints_a_ticket_with_the_a4_envelope(mcp, tagged_agent, mint):
    alice = mcp("alice")
    r = alice.call("delete_tag", ARGS)
    err = error_of(r)
    assert err["code"] == -32006
    assert err["message"] == ("approval required: a human must approve this call (on tier 'operator', Tag:Delete "
                              "needs an approval)")
    data = err["data"]
    assert set(data) == {"correlation_id", "retry_after_ms", "remediation", "approval_id", "status_url", "review_url",
                         "tier"}
    assert CID.match(data["correlation_id"])
    assert data["retry_after_ms"] == 30000
    assert data["remediation"] == REMEDIATION.format(page="/admin/approvals/approval/")
    assert HEX32.match(data["approval_id"])
    assert data["status_url"] == f"/api/v1/approvals/{data['approval_id']}"
    # The review page the remediation names exists: an approver opens it.
    assert data["review_url"] == f"/admin/approvals/approval/{data['approval_id']}/review/"
    assert data["tier"] == "operator"

    ticket = Approval.objects.get()
    assert (ticket.id, ticket.definition_id, ticket.submitted_by, ticket.status, ticket.origin) == (
        data["approval_id"], "mcp.delete_tag", "alice", "pending", "mcp")
    assert ticket.scope_expression == CANONICAL == canonical_args({**ARGS, "approval_id": "x" * 32})
    assert ticket.expires_at == ticket.submitted_at + timedelta(days=7)
    assert Tag.objects.filter(key="owner").exists()  # nothing ran

    [row] = audits()
    assert (row.result, row.principal, row.target_type, row.target_id) == ("pending", "alice", "mcp_tool", "delete_tag")
    assert row.detail == f"agent_id=host-1 approval_id={ticket.id}"

    # The status_url answers the ticket (an MCP token may read it: Approval:Read is a read).
    rest = Client().get(data["status_url"], HTTP_AUTHORIZATION=f"Bearer {alice.token}")
    assert rest.status_code == 200
    assert rest.json()["data"]["status"] == "pending" and rest.json()["data"]["scope_expression"] == CANONICAL


def test_dedup_returns_the_same_pending_ticket(mcp, tagged_agent):
    alice = mcp("alice")
    first = mint_ticket(alice)
    again = error_of(alice.call("delete_tag", {"key": "owner", "agent_id": "host-1"}))  # key order is irrelevant
    assert again["code"] == -32006 and again["data"]["approval_id"] == first
    assert again["data"]["correlation_id"] != ""
    assert Approval.objects.count() == 1
    assert audits()[-1].detail == f"agent_id=host-1 approval_id={first} (deduped)"
    other = mint_ticket(alice, {"agent_id": "host-1", "key": "other"})
    assert other != first and Approval.objects.count() == 2
    # Another submitter with the same arguments gets their own ticket.
    bob = mcp("bob")
    assert mint_ticket(bob) not in (first, other)


def test_recall_while_pending_returns_the_same_envelope(mcp, tagged_agent):
    alice = mcp("alice")
    tid = mint_ticket(alice)
    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert err["code"] == -32006 and err["data"]["approval_id"] == tid
    assert err["data"]["retry_after_ms"] == 30000 and err["data"]["status_url"] == f"/api/v1/approvals/{tid}"
    row = audits()[-1]
    assert row.result == "pending" and row.detail == f"agent_id=host-1 approval_id={tid} still pending"
    assert Approval.objects.get().consumed_at is None


# --- 2/3. approve, recall, consume once ---------------------------------------------------------

def test_approved_recall_runs_the_tool_once_then_refuses_replays(mcp, tagged_agent, approver):
    alice = mcp("alice")
    tid = mint_ticket(alice)
    assert approve(approver, tid) == {"id": tid, "status": "approved"}
    res = result_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert res["structuredContent"] == {"agent_id": "host-1", "key": "owner", "deleted": True}
    assert not Tag.objects.filter(key="owner").exists() and Tag.objects.filter(key="other").exists()
    ticket = Approval.objects.get(pk=tid)
    assert ticket.status == "approved" and ticket.consumed_at is not None and ticket.consumed_by == "alice"
    row = audits()[-1]
    assert row.result == "approved" and f"consumed approval_id={tid}" in row.detail
    assert [a.result for a in audits("approval.approve")] == ["success"]

    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert err["code"] == -32003 and err["message"] == ALREADY_USED
    assert err["data"]["retry_after_ms"] is None and CID.match(err["data"]["correlation_id"])
    assert audits()[-1].result == "denied" and audits()[-1].detail.endswith("refused:replay")
    assert len(audits("tag.delete")) == 1


def test_fifty_concurrent_recalls_run_the_handler_exactly_once(mcp, tagged_agent, approver):
    alice = mcp("alice")
    tid = mint_ticket(alice)
    approve(approver, tid)
    n = 50
    barrier = threading.Barrier(n)
    responses = [None] * n

    def recall(i):
        try:
            barrier.wait(timeout=30)
            responses[i] = request(body={"jsonrpc": "2.0", "id": i, "method": "tools/call",
                                         "params": {"name": "delete_tag", "arguments": {**ARGS, "approval_id": tid}}},
                                   headers=alice.headers())
        except Exception as exc:  # surfaced by the assertions below
            responses[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=recall, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(not t.is_alive() for t in threads)
    bodies = [r.json() if not isinstance(r, Exception) else {"exception": repr(r)} for r in responses]
    ok = [b for b in bodies if "result" in b]
    refused = [b["error"] for b in bodies if "error" in b]
    assert len(ok) == 1, bodies
    assert ok[0]["result"]["structuredContent"]["deleted"] is True
    assert len(refused) == n - 1, bodies
    assert {(e["code"], e["message"]) for e in refused} == {(-32003, ALREADY_USED)}
    # Exactly one handler run: one tag.delete audit row, one 'approved' call row, 49 masked denials.
    assert len(audits("tag.delete")) == 1
    assert not Tag.objects.filter(key="owner").exists()
    calls = audits(detail__contains=f"approval_id={tid}")
    assert sum(a.result == "approved" for a in calls) == 1
    denied = [a for a in calls if a.result == "denied"]
    assert len(denied) == n - 1
    assert all(re.search(r"refused:(replay|lost_race)$", a.detail) for a in denied)
    assert Approval.objects.get(pk=tid).consumed_by == "alice"


def test_approve_reject_and_withdraw_at_once_decide_a_ticket_once(mcp, tagged_agent, approver, make_user):
    """Two reviewers and the submitter act on one pending ticket at the same instant: the ticket's row lock makes
    them take turns, so at most one review decides; a withdrawal stands before a review, or after an approval."""
    alice = mcp("alice")
    dave = approver_principal(make_user, "dave", "Approver")
    submitter = Principal(user=make_user("alice"))
    for _ in range(5):
        tid = mint_ticket(alice)
        outcomes = at_once(partial(approve, approver, tid), partial(approve, dave, tid, Approval.REJECTED),
                           partial(withdraw, submitter, tid))
        (ak, _), (rk, _), (wk, _) = outcomes
        # One review decides; the submitter may still withdraw an approved, unused ticket after it (or first).
        assert (ak, rk) in (("ok", "error"), ("error", "ok"), ("error", "error")), outcomes
        assert (ak, rk) != ("error", "error") or wk == "ok", outcomes
        assert all(re.match(r"only (a )?pending", str(e)) for kind, e in outcomes if kind == "error"), outcomes
        status = "withdrawn" if wk == "ok" else ("approved" if ak == "ok" else "rejected")
        assert Approval.objects.get(pk=tid).status == status
        Approval.objects.filter(pk=tid).delete()


def test_schema_invalid_recall_consumes_nothing(mcp, tagged_agent, approver):
    alice = mcp("alice")
    tid = mint_ticket(alice)
    approve(approver, tid)
    for bad in ({**ARGS, "approval_id": 12345}, {**ARGS, "approval_id": "Z" * 32},
                {**ARGS, "approval_id": tid, "extra": 1}, {"agent_id": "host-1", "approval_id": tid}):
        err = error_of(alice.call("delete_tag", bad))
        assert err["code"] == -32602, err
        assert err["message"].startswith("arguments do not match the tool input schema at ")
    assert "'/approval_id'" in error_of(alice.call("delete_tag", {**ARGS, "approval_id": 1}))["message"]
    ticket = Approval.objects.get()
    assert ticket.consumed_at is None and ticket.status == "approved" and Approval.objects.count() == 1
    # Invalid arguments without an approval_id mint nothing either.
    assert error_of(alice.call("delete_tag", {"agent_id": "host-1"}))["code"] == -32602
    assert Approval.objects.count() == 1
    result_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))  # still redeemable


# --- refusals of the recall ---------------------------------------------------------------------

def test_viewer_who_read_the_id_cannot_redeem_it(mcp, tagged_agent, approver):
    alice = mcp("alice")
    tid = mint_ticket(alice)
    approve(approver, tid)
    viewer = mcp("victor", role="Operator", tier="operator")
    # Others see only their own tickets (issue 10 item 7); here victor learned the id some other way.
    listed = Client().get("/api/v1/approvals?status=approved", HTTP_AUTHORIZATION=f"Bearer {viewer.token}")
    assert listed.status_code == 200 and listed.json()["data"] == []
    err = error_of(viewer.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert err["code"] == -32003 and err["message"] == ALREADY_USED  # the same words as a replay
    row = audits(principal="victor")[-1]
    assert row.result == "denied" and row.detail.endswith("refused:foreign_submitter")
    assert Approval.objects.get(pk=tid).consumed_at is None and Tag.objects.filter(key="owner").exists()
    result_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))  # the submitter still can


def test_a_foreign_caller_learns_no_status_of_a_ticket(mcp, tagged_agent, approver):
    """Someone else's ticket (its id and arguments learnt some other way) reads "already used" whatever its status:
    a pending one answered -32006 with its links, a rejected or withdrawn one said so — the status of a ticket the
    caller may not even read. The submitter still gets the real answers."""
    alice = mcp("alice")
    victor = mcp("victor", role="Operator", tier="operator")
    pending = mint_ticket(alice)
    rejected = mint_ticket(alice, {"agent_id": "host-1", "key": "other"})
    approve(approver, rejected, Approval.REJECTED)
    for tid, args in ((pending, ARGS), (rejected, {"agent_id": "host-1", "key": "other"})):
        err = error_of(victor.call("delete_tag", {**args, "approval_id": tid}))
        assert (err["code"], err["message"]) == (-32003, ALREADY_USED), err
        assert "status_url" not in err["data"] and "review_url" not in err["data"]
        row = audits(principal="victor")[-1]
        assert row.result == "denied" and row.detail.endswith("refused:foreign_submitter")
    assert error_of(alice.call("delete_tag", {**ARGS, "approval_id": pending}))["code"] == -32006
    assert error_of(alice.call("delete_tag", {"agent_id": "host-1", "key": "other", "approval_id": rejected}))[
        "message"] == "approval was rejected"
    assert Approval.objects.get(pk=pending).status == Approval.PENDING


def test_a_ticket_is_recalled_by_the_token_that_asked_for_it(mcp, tagged_agent, approver, mint):
    """The approver approves what one token (one MCP client: its name, tier and client are on the review page)
    asked for. Another token of the same person — another OAuth client of theirs, say, which lists their approved
    tickets — took it over and ran it (and got its result: a created token's secret); so did any of their tokens
    after the asking one was revoked. Now only the asking token, or its rotation successor, redeems it; another
    token's identical call gets a ticket of its own."""
    from yuzu.models import ApiToken
    from yuzu.tokens import rotate_token

    alice = mcp("alice")
    other = McpClient(mint("alice", role="Operator", tier="operator"))
    other.initialize()
    tid = mint_ticket(alice)
    approve(approver, tid)
    listed = result_of(other.call("list_pending_approvals", {"status": "approved"}))["structuredContent"]
    assert [a["id"] for a in listed["approvals"]] == [tid]  # the person's tickets stay readable to each token
    err = error_of(other.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert (err["code"], err["message"]) == (-32003, ALREADY_USED)
    assert audits(principal="alice")[-1].detail.endswith("refused:foreign_token")
    assert Approval.objects.get(pk=tid).consumed_at is None and Tag.objects.filter(key="owner").exists()
    # the other token's identical call is a ticket of its own, not the first token's
    assert mint_ticket(other) != tid
    # revoked: no other token of the person takes its approved ticket over
    asking = ApiToken.objects.get(pk=Approval.objects.get(pk=tid).requester["token_id"])
    ApiToken.objects.filter(pk=asking.pk).update(revoked_at=timezone.now())
    assert error_of(other.call("delete_tag", {**ARGS, "approval_id": tid}))["message"] == ALREADY_USED
    # rotated: the successor carries on with its predecessor's tickets
    ApiToken.objects.filter(pk=asking.pk).update(revoked_at=None)
    successor = rotate_token(Principal(user=asking.owner, token=asking), asking.pk)
    heir = McpClient(successor["token"])
    heir.initialize()
    out = result_of(heir.call("delete_tag", {**ARGS, "approval_id": tid}))["structuredContent"]
    assert out["deleted"] is True


def test_mismatch_refuses_and_leaves_the_ticket_usable(mcp, tagged_agent, approver):
    alice = mcp("alice")
    tid = mint_ticket(alice)
    approve(approver, tid)
    # Wrong arguments.
    err = error_of(alice.call("delete_tag", {"agent_id": "host-1", "key": "other", "approval_id": tid}))
    assert err["code"] == -32003 and err["message"] == MISMATCH
    assert err["data"]["remediation"] == "re-call with exactly the arguments the ticket was minted for"
    assert audits()[-1].detail == f"agent_id=host-1 approval_id={tid} mismatch"
    # Wrong tool: a ticket for another tool with the very same arguments.
    other = Approval.objects.create(definition_id="mcp.set_tag", submitted_by="alice", scope_expression=CANONICAL,
                                    status=Approval.APPROVED, reviewed_by="carol", reviewed_at=timezone.now())
    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": other.id}))
    assert err["code"] == -32003 and err["message"] == MISMATCH
    # An id nobody minted.
    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": "f" * 32}))
    assert err["code"] == -32003 and err["message"] == MISMATCH
    assert Approval.objects.get(pk=tid).consumed_at is None and Approval.objects.get(pk=other.id).consumed_at is None
    assert Tag.objects.filter(key="owner").exists() and Tag.objects.filter(key="other").exists()
    result_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))


def test_a_recalls_agent_id_writes_no_words_of_its_own_into_the_audit_row(mcp, tagged_agent, approver):
    """The recall's refusals record the agent_id before anything checked it: a space or a newline in it wrote words
    of the caller's choosing into the row (here a fake "consumed" of another ticket). Such an id is quoted."""
    alice = mcp("alice")
    tid = mint_ticket(alice)
    forged = "host-1 approval_id=" + "e" * 32 + " consumed\nagent_id=host-1"
    err = error_of(alice.call("delete_tag", {"agent_id": forged, "key": "owner", "approval_id": tid}))
    assert err["message"] == MISMATCH
    row = audits()[-1]
    assert row.detail == f'agent_id={json.dumps(forged)} approval_id={tid} mismatch', row.detail
    assert "\n" not in row.detail


def test_rejected_ticket(mcp, tagged_agent, approver):
    alice = mcp("alice")
    tid = mint_ticket(alice)
    assert approve(approver, tid, Approval.REJECTED) == {"id": tid, "status": "rejected"}
    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert err["code"] == -32003 and err["message"] == "approval was rejected"
    assert err["data"]["remediation"] == "call again without approval_id to request a new approval"
    assert audits()[-1].detail == f"agent_id=host-1 approval_id={tid} rejected"
    assert [a.result for a in audits("approval.reject")] == ["success"]
    assert Tag.objects.filter(key="owner").exists()
    # A rejected ticket is not "pending", so the next call mints a fresh one.
    assert mint_ticket(alice) != tid


def test_seven_day_lifetime(mcp, tagged_agent, approver):
    alice = mcp("alice")
    pending = mint_ticket(alice)
    approved = mint_ticket(alice, {"agent_id": "host-1", "key": "other"})
    approve(approver, approved)
    young = timedelta(days=7) - timedelta(minutes=1)
    backdate(pending, young)
    backdate(approved, young)
    assert error_of(alice.call("delete_tag", {**ARGS, "approval_id": pending}))["code"] == -32006
    assert Approval.objects.get(pk=approved).expires_at > timezone.now()
    backdate(pending, timedelta(minutes=2))
    backdate(approved, timedelta(minutes=2))
    # Before any sweep, the review page already says so and offers no decision (a probe saw the Approve form).
    page = admin_client(approver.user, approver.device).get(f"/admin/approvals/approval/{pending}/review/")
    assert 'id="approve-button"' not in page.content.decode() and "This ticket is expired" in page.content.decode()

    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": pending}))
    assert err["code"] == -32003 and err["message"] == "approval was expired"
    assert Approval.objects.get(pk=pending).status == "expired"
    err = error_of(alice.call("delete_tag", {"agent_id": "host-1", "key": "other", "approval_id": approved}))
    assert err["code"] == -32003 and err["message"] == EXPIRED_APPROVED == "approval expired (past its 7-day lifetime)"
    assert audits()[-1].detail == f"agent_id=host-1 approval_id={approved} expired"
    t = Approval.objects.get(pk=approved)
    assert t.status == "expired" and t.consumed_at is None
    # Asking again keeps the distinct message, and nothing ran.
    err = error_of(alice.call("delete_tag", {"agent_id": "host-1", "key": "other", "approval_id": approved}))
    assert err["message"] == EXPIRED_APPROVED
    assert Tag.objects.count() == 2


def test_lifetime_with_a_controlled_clock(mcp, tagged_agent, approver, monkeypatch):
    """The same rule with django.utils.timezone.now moved forward instead of the ticket moved back; an
    approved ticket expired by the lazy sweep (another mint) keeps its distinct message."""
    alice = mcp("alice")
    approved = mint_ticket(alice)
    approve(approver, approved)
    pending = mint_ticket(alice, {"agent_id": "host-1", "key": "other"})
    real_now = timezone.now
    later = real_now() + APPROVAL_LIFETIME + timedelta(seconds=5)
    monkeypatch.setattr(timezone, "now", lambda: later)
    bob = mcp("bob")
    mint_ticket(bob)  # the mint's sweep expires both of alice's tickets
    assert set(Approval.objects.filter(submitted_by="alice").values_list("status", flat=True)) == {"expired"}
    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": approved}))
    assert err["code"] == -32003 and err["message"] == EXPIRED_APPROVED
    err = error_of(alice.call("delete_tag", {"agent_id": "host-1", "key": "other", "approval_id": pending}))
    assert err["code"] == -32003 and err["message"] == "approval was expired"
    assert Tag.objects.count() == 2


def test_pre_consume_precondition_leaves_the_ticket_unconsumed(mcp, tagged_agent, approver, monkeypatch):
    alice = mcp("alice")
    tid = mint_ticket(alice)
    approve(approver, tid)
    tool = catalogue("v1").tools["delete_tag"]
    monkeypatch.setattr(tool, "precondition", lambda ctx, args: False)
    before = REGISTRY.get_sample_value("yuzu_mcp_approval_precondition_denied_total") or 0.0
    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert err["code"] == -32003 and err["message"] == PRECONDITION
    assert err["data"]["remediation"] == "retry later with the same approval_id"
    assert REGISTRY.get_sample_value("yuzu_mcp_approval_precondition_denied_total") == before + 1
    assert Approval.objects.get(pk=tid).consumed_at is None
    monkeypatch.setattr(tool, "precondition", None)
    result_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))


def test_rest_origin_ticket_cannot_be_redeemed_over_mcp(mcp, tagged_agent):
    alice = mcp("alice")
    rest = Approval.objects.create(definition_id="mcp.delete_tag", submitted_by="alice", scope_expression=CANONICAL,
                                   origin=Approval.ORIGIN_REST, status=Approval.APPROVED, reviewed_by="carol",
                                   reviewed_at=timezone.now())
    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": rest.id}))
    assert err["code"] == -32003 and err["message"] == ALREADY_USED
    assert audits()[-1].detail.endswith("refused:foreign_origin:rest")
    assert Approval.objects.get(pk=rest.id).consumed_at is None and Tag.objects.filter(key="owner").exists()


def test_rbac_runs_before_the_gate_so_no_ticket_is_minted_or_burned(mcp, tagged_agent, approver):
    from yuzu.models import RoleAssignment

    # A Viewer with an operator-tier token passes the tier check (Tag:Delete) but not RBAC: no ticket.
    vic = mcp("victor", role="Viewer", tier="operator")
    err = error_of(vic.call("delete_tag", ARGS))
    assert err["code"] == -32003 and err["message"].startswith("permission denied: Tag:Delete (none of your roles")
    assert err["data"]["permission"] == "Tag:Delete"
    assert not Approval.objects.exists()
    assert audits(principal="victor")[-1].result == "denied"
    # A submitter who loses the role between approval and recall is refused without burning the ticket.
    alice = mcp("alice")
    tid = mint_ticket(alice)
    approve(approver, tid)
    before = burned()
    RoleAssignment.objects.filter(user__username="alice").delete()
    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert err["code"] == -32003 and err["data"]["permission"] == "Tag:Delete"
    assert burned() == before and Approval.objects.get(pk=tid).consumed_at is None
    assert Tag.objects.filter(key="owner").exists()


# --- caps, store faults, degraded mode ----------------------------------------------------------

def test_per_submitter_cap(mcp, tagged_agent):
    alice = mcp("alice")
    first = mint_ticket(alice)
    Approval.objects.bulk_create([Approval(definition_id="mcp.delete_tag", submitted_by="alice",
                                           scope_expression=f'{{"agent_id":"h{i}","key":"k"}}') for i in range(24)])
    err = error_of(alice.call("delete_tag", {"agent_id": "host-1", "key": "other"}))
    assert err["code"] == -32004
    assert err["message"] == "too many pending approvals (you hold 25, the most one submitter may)"
    assert "withdraw_approval" in err["data"]["remediation"]
    assert err["data"]["retry_after_ms"] is None and "approval_id" not in err["data"]
    assert audits()[-1].result == "denied" and audits()[-1].detail.startswith("pending_cap")
    assert Approval.objects.filter(submitted_by="alice").count() == 25
    # Dedup still answers at the cap; another submitter is not affected.
    assert mint_ticket(alice) == first
    assert mint_ticket(mcp("bob"))


def test_global_cap(mcp, tagged_agent):
    Approval.objects.bulk_create([Approval(definition_id="mcp.delete_tag", submitted_by=f"user{i % 100}",
                                           scope_expression=f'{{"n":{i}}}', origin=Approval.ORIGIN_REST)
                                  for i in range(1000)])
    alice = mcp("alice")
    err = error_of(alice.call("delete_tag", ARGS))
    assert err["code"] == -32603 and err["message"] == "the approval queue is full; retry later"
    assert err["data"]["retry_after_ms"] == 5000 and "approval_id" not in err["data"]
    assert audits()[-1].detail.startswith("global_pending_cap")
    assert not Approval.objects.filter(submitted_by="alice").exists()


def test_store_fault_on_mint_and_recall(mcp, tagged_agent, approver, monkeypatch):
    alice = mcp("alice")
    tid = mint_ticket(alice)
    approve(approver, tid)

    def broken(*a, **kw):
        raise DatabaseError("store down")

    monkeypatch.setattr(Approval.objects, "get_queryset", broken)
    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert err["code"] == -32603 and err["message"] == "approval store unavailable"
    assert err["data"]["retry_after_ms"] == 5000
    err = error_of(alice.call("delete_tag", {"agent_id": "host-1", "key": "other"}))
    assert err["code"] == -32603 and err["data"]["retry_after_ms"] == 5000
    monkeypatch.undo()
    assert Approval.objects.get(pk=tid).consumed_at is None
    result_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))


def test_without_an_approval_store_gated_calls_are_tier_denied(mcp, tagged_agent):
    alice = mcp("alice")
    saved = approval_gate()
    set_approval_gate(None)
    try:
        err = error_of(alice.call("delete_tag", ARGS))
    finally:
        set_approval_gate(saved)
    assert err["code"] == -32004 and "approval_id" not in err["data"]
    assert not Approval.objects.exists()


def test_supervised_tier_gates_its_writes_too(mcp, approver):
    sup = mcp("sam", role="Administrator", tier="supervised")
    args = {"name": "payments-prod", "description": "payments servers"}
    tid = mint_ticket(sup, args, tool="create_management_group")
    assert Approval.objects.get(pk=tid).definition_id == "mcp.create_management_group"
    approve(approver, tid)
    res = result_of(sup.call("create_management_group", {**args, "approval_id": tid}))
    assert res["structuredContent"]["name"] == "payments-prod"
    from fleet.models import ManagementGroup

    assert ManagementGroup.objects.filter(name="payments-prod").count() == 1
    assert error_of(sup.call("create_management_group", {**args, "approval_id": tid}))["message"] == ALREADY_USED


@pytest.mark.parametrize("name", ["weekly-report\u202e9202 ,dnuorg", "bell\x07", "esc\x1b]0;x", "c1\x85",
                                  "isolate\u2066x\u2069", "mark\u200f", "arabic\u061c"])
def test_a_token_name_with_control_or_bidi_characters_is_refused_before_any_ticket(mcp, name):
    """The one input contract for token names (yuzu.tokens.plan_create_token → yuzu.text.check_label): -32602
    naming the character, and no ticket minted for a name no approver could read as it is."""
    sup = mcp("sam", role="Administrator", tier="supervised")
    err = error_of(sup.call("create_api_token", {"name": name, "mcp_tier": "readonly"}))
    assert err["code"] == -32602 and "control or bidirectional" in err["message"], err
    assert not Approval.objects.exists()


def test_the_approver_sees_hidden_characters_by_name_on_every_page(mcp, approver):
    """A submitter's text holding U+202E (RIGHT-TO-LEFT OVERRIDE) and terminal escapes is shown as <U+202E>,
    <U+001B>… in the title, the summary, the arguments, the reason, the client name, the queue and the bulk-reject
    page: nothing reorders or hides what the approver reads (the characters never reach the HTML raw)."""
    from approvals.notify import ticket_message

    sly = "weekly-report\u202e9202 ,dnuorg\x1b]0;x\x07"
    ticket = Approval.objects.create(
        definition_id="mcp.create_api_token", submitted_by="sam", summary=f"Create a token named '{sly}' for sam",
        scope_expression=json.dumps({"name": sly, "mcp_tier": "readonly"}),
        facts={"reason": f"because {sly}"}, requester={"client_name": f"client{sly}", "token_name": sly})
    c = admin_client(approver.user, approver.device)
    shown = "weekly-report<U+202E>9202 ,dnuorg<U+001B>]0;x<U+0007>"
    review = c.get(f"/admin/approvals/approval/{ticket.id}/review/").content.decode()
    queue = c.get("/admin/approvals/approval/").content.decode()
    bulk = c.post("/admin/approvals/approval/", {"action": "reject_selected", "_selected_action": [ticket.id]})
    for page in (review, queue, bulk.content.decode()):
        assert not re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", page)
        assert shown in html.unescape(page)
    review = html.unescape(review)
    assert re.search(f"<title>Create a token named '{re.escape(shown)}'", review)
    assert re.search(f'id="ticket-summary">Create a token named \'{re.escape(shown)}\'', review)
    # the raw arguments, folded: JSON writes C0 controls as \u escapes itself; the bidi control by name
    assert '"name": "weekly-report<U+202E>9202 ,dnuorg\\u001b]0;x\\u0007"' in review.split('id="ticket-arguments"')[1]
    assert f"because {shown}" in review and f"client{shown}" in review
    assert shown in ticket_message(ticket)["summary"] and "\u202e" not in json.dumps(ticket_message(ticket),
                                                                                       ensure_ascii=False)


def test_a_bundle_steps_plugin_names_and_a_targets_reported_fields_are_shown_by_name(mcp, approver):
    """A bundle for an agent that reported no catalogue takes any plugin name: its steps list showed the name raw,
    so U+202E in it reordered the approver's line; nor were a target's self-reported hostname and OS shown by name."""
    Agent.objects.create(agent_id="a1", hostname="web\u202e1-bd", os="linux\u2066x", connected=True)
    sup = mcp("sam", role="Administrator", tier="supervised")
    err = error_of(sup.call("execute_bundle", {"agent_id": "a1", "steps": [
        {"plugin": "os", "action": "info\u202efni"}, {"plugin": "os\u202e", "action": "info"}]}))
    assert err["code"] == -32006, err
    c = admin_client(approver.user, approver.device)
    review = c.get(f"/admin/approvals/approval/{err['data']['approval_id']}/review/").content.decode()
    assert not re.search("[\u202a-\u202e\u2066-\u2069]", review)
    review = html.unescape(review)
    assert "os.info<U+202E>fni" in review and "os<U+202E>.info" in review
    assert "web<U+202E>1-bd" in review and "linux<U+2066>x" in review



ZW = "\u200b\u200d\u2060\ufeff\u00ad\ufe0f\U000e0041"  # zero-width space/joiner, word joiner, BOM, soft hyphen, VS16, tag A
ZW_SHOWN = "<U+200B><U+200D><U+2060><U+FEFF><U+00AD><U+FE0F><U+E0041>"
INVISIBLE_RE = "[\u00ad\u200b-\u200f\u2060-\u2064\ufeff\ufe00-\ufe0f\U000e0000-\U000e0fff]"


def test_the_approver_sees_invisible_characters_by_name_on_every_page(mcp, approver):
    """Zero-width and other format characters draw nothing: 'db-1' and 'db-<U+200B>1' read the same to an approver,
    and tag characters carry whole hidden sentences. In every piece of text a submitter or an agent controls — the
    summary, the reason, the parameters, plugin names and descriptions, the token and client names, the submitter,
    a target's hostname, OS and groups — they are shown by name on the review page, the queue and the bulk-reject
    page, and plain ASCII stays as it was."""
    Agent.objects.create(agent_id="a1", hostname=f"db-{ZW}1", os=f"linux{ZW}", connected=True)
    from fleet.models import ManagementGroup

    ManagementGroup.objects.create(name=f"ops{ZW}").members.add("a1")
    ticket = Approval.objects.create(
        definition_id="mcp.execute_bundle", submitted_by=f"sam{ZW}", summary=f"Run os.info on db-{ZW}1",
        scope_expression=json.dumps({"agent_id": "a1", "note": f"x{ZW}y"}), pins={"agents": ["a1"]},
        facts={"reason": f"because{ZW}", "plugin": f"os{ZW}.info", "description": f"reads{ZW} the OS",
               "params": {f"k{ZW}": f"v{ZW}"}, "steps": [{"plugin": f"os{ZW}.info", "description": f"step{ZW}"}]},
        requester={"client_name": f"client{ZW}", "client_version": f"1{ZW}", "token_name": f"tok{ZW}"})
    c = admin_client(approver.user, approver.device)
    review = c.get(f"/admin/approvals/approval/{ticket.id}/review/").content.decode()
    queue = c.get("/admin/approvals/approval/").content.decode()
    bulk = c.post("/admin/approvals/approval/", {"action": "reject_selected", "_selected_action": [ticket.id]})
    for page in (review, queue, bulk.content.decode()):
        assert not re.search(INVISIBLE_RE, page)
        assert f"Run os.info on db-{ZW_SHOWN}1" in html.unescape(page) and f"sam{ZW_SHOWN}" in html.unescape(page)
    review = html.unescape(review)
    assert re.search(f'id="ticket-summary">Run os.info on db-{re.escape(ZW_SHOWN)}1<', review)
    for shown in (f"because{ZW_SHOWN}", f"os{ZW_SHOWN}.info", f"reads{ZW_SHOWN} the OS", f"k{ZW_SHOWN}=v{ZW_SHOWN}",
                  f"step{ZW_SHOWN}", f"client{ZW_SHOWN} 1{ZW_SHOWN}", f"tok{ZW_SHOWN}", f"db-{ZW_SHOWN}1",
                  f"linux{ZW_SHOWN}", f"ops{ZW_SHOWN}", f"Approving lets <strong>sam{ZW_SHOWN}</strong> run this", f'"note": "x{ZW_SHOWN}y"'):
        assert shown in review, shown
    assert "<title>Run os.info on db-" in review


@pytest.mark.parametrize("name", ["db\u200b1", "bom\ufeff", "soft\u00adhyphen", "tag\U000e0041", "wj\u2060"])
def test_a_token_name_with_invisible_characters_is_refused_before_any_ticket(mcp, name):
    sup = mcp("sam", role="Administrator", tier="supervised")
    err = error_of(sup.call("create_api_token", {"name": name, "mcp_tier": "readonly"}))
    assert err["code"] == -32602 and "invisible" in err["message"] and "U+" in err["message"], err
    assert not Approval.objects.exists()



def test_the_api_returns_a_submitters_text_raw_and_names_the_fields_holding_hidden_characters(mcp, approver, mint):
    """REST and MCP answer exact text — a client must be able to compare a ticket's arguments with what it sent, and
    renders for its own medium — so a reviewer's tool cannot see from the text alone that it hides something:
    ``hidden_characters`` lists the fields that hold control, bidi or invisible characters (empty when none does)."""
    Agent.objects.create(agent_id="a1", hostname=f"db-{ZW}1", connected=True)
    sly = Approval.objects.create(
        definition_id="mcp.execute_bundle", submitted_by="sam", summary=f"Run os.info on db-{ZW}1",
        scope_expression=json.dumps({"agent_id": "a1", "note": "esc\x1b"}, ensure_ascii=False),
        pins={"agents": ["a1"]}, facts={"reason": f"because\u202e{ZW}"}, requester={"client_name": "claude"})
    plain = Approval.objects.create(definition_id="mcp.delete_tag", submitted_by="sam", summary="Delete tag owner",
                                    scope_expression='{"agent_id":"a1","key":"owner"}', pins={"agents": ["a1"]})
    c = Client(HTTP_AUTHORIZATION=f"Bearer {mint('anna', role='Approver')}")
    rows = {r["id"]: r for r in c.get("/api/v1/approvals").json()["data"]}
    assert rows[sly.id]["summary"] == f"Run os.info on db-{ZW}1"  # raw
    assert rows[sly.id]["hidden_characters"] == ["scope_expression", "summary"]
    assert rows[plain.id]["hidden_characters"] == []
    detail = c.get(f"/api/v1/approvals/{sly.id}").json()["data"]
    assert detail["facts"]["reason"] == f"because\u202e{ZW}"
    assert detail["hidden_characters"] == ["facts", "scope_expression", "summary", "targets"]
    listed = result_of(mcp("anna", role="Approver").call("list_pending_approvals", {}))["structuredContent"]
    assert {r["id"]: r["hidden_characters"] for r in listed["approvals"]} == {
        sly.id: ["scope_expression", "summary"], plain.id: []}


# --- REST: reading and reviewing ----------------------------------------------------------------

def test_rest_read_routes(mcp, tagged_agent, approver, mint):
    alice = mcp("alice")
    tid = mint_ticket(alice)
    # A Viewer who did not submit it neither lists nor reads it (issue 10 item 7) …
    viewer = Client(HTTP_AUTHORIZATION=f"Bearer {mint('reader', role='Viewer')}")
    assert viewer.get("/api/v1/approvals").json()["data"] == []
    assert viewer.get(f"/api/v1/approvals/{tid}").status_code == 404
    assert viewer.get("/api/v1/approvals/pending/count").json()["data"] == {"pending": 0}
    # … the submitter does, and so does an approver.
    assert Client(HTTP_AUTHORIZATION=f"Bearer {alice.token}").get(f"/api/v1/approvals/{tid}").status_code == 200
    c = Client(HTTP_AUTHORIZATION=f"Bearer {mint('anna', role='Approver')}")
    listed = c.get("/api/v1/approvals")
    assert listed.status_code == 200 and listed.json()["meta"]["count"] == 1
    row = listed.json()["data"][0]
    assert row["id"] == tid and row["definition_id"] == "mcp.delete_tag" and row["submitted_by"] == "alice"
    assert row["consumed"] is False and row["origin"] == "mcp"
    assert c.get("/api/v1/approvals?status=approved").json()["data"] == []
    bad = c.get("/api/v1/approvals?status=bogus")
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("status must be one of")
    detail = c.get(f"/api/v1/approvals/{tid}")
    assert detail.status_code == 200 and detail.json()["data"]["status"] == "pending"
    assert c.get(f"/api/v1/approvals/{'0' * 32}").status_code == 404
    assert c.get("/api/v1/approvals/pending/count").json()["data"] == {"pending": 1}


def test_a_service_scoped_token_reads_no_ticket_over_rest_either(mcp, tagged_agent, mint):
    """A ticket's summary and targets name devices (here host-1, of no service). A token of its submitter scoped to
    service=payments read them through the REST twins of get_approval and list_pending_approvals — which, like
    every tool of the "denied" class, refuse such a token over MCP — and could withdraw the ticket."""
    tid = mint_ticket(mcp("alice"))
    raw = mint("alice", role="Operator", tier="operator", scope_service="payments")
    scoped = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    for method, path in (("get", "/api/v1/approvals"), ("get", f"/api/v1/approvals/{tid}"),
                         ("post", f"/api/v1/approvals/{tid}/withdraw")):
        r = getattr(scoped, method)(path)
        assert r.status_code == 403 and "service-scoped" in r.json()["error"]["message"], (path, r.content)
        assert "host-1" not in r.content.decode()
    assert Approval.objects.get(pk=tid).status == Approval.PENDING
    c = McpClient(raw)
    c.initialize()
    for tool, args in (("get_approval", {"approval_id": tid}), ("list_pending_approvals", {})):
        assert "service-scoped" in error_of(c.call(tool, args))["message"]  # the MCP twins, as they were


def test_rest_review_rules(mcp, tagged_agent, approver, mint):
    alice = mcp("alice")
    tid = mint_ticket(alice)
    url = f"/api/v1/approvals/{tid}/approve"

    # A token (even an Approver's) cannot approve.
    tok = mint("carol", role="Approver")
    r = Client(HTTP_AUTHORIZATION=f"Bearer {tok}").post(url, {"comment": "x"}, content_type="application/json")
    assert r.status_code == 403
    assert r.json()["error"]["message"] == "approver_assurance_required:non_interactive_session"
    row = audits("approval.approve")[-1]
    assert row.result == "denied" and row.detail == "approver_assurance:non_interactive_session"

    # An interactive session whose proof is stale.
    c = admin_client(approver.user, approver.device)
    make_stale(c)
    r = c.post(url, {"comment": "x"}, content_type="application/json")
    assert r.status_code == 403 and r.json()["error"]["message"] == "approver_assurance_required:mfa_proof_missing"

    # Fresh proof: approved.
    s = c.session
    s[MFA_SESSION_KEY] = time.time()
    s.save()
    r = c.post(url, {"comment": "ok to delete"}, content_type="application/json")
    assert r.status_code == 200 and r.json()["data"] == {"id": tid, "status": "approved"}
    t = Approval.objects.get(pk=tid)
    assert (t.reviewed_by, t.review_comment) == ("carol", "ok to delete") and t.reviewed_at is not None
    assert audits("approval.approve")[-1].result == "success"

    # Not pending any more.
    r = c.post(f"/api/v1/approvals/{tid}/reject", {}, content_type="application/json")
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "only pending approvals can be reviewed (this one is approved)"
    assert audits("approval.reject")[-1].result == "denied"

    # Reviewer == submitter.
    own = Approval.objects.create(definition_id="mcp.delete_tag", submitted_by="carol", scope_expression="{}",
                                  origin=Approval.ORIGIN_REST)
    r = c.post(f"/api/v1/approvals/{own.id}/approve", {}, content_type="application/json")
    assert r.status_code == 400 and r.json()["error"]["message"] == "the reviewer must differ from the submitter"
    assert Approval.objects.get(pk=own.id).status == "pending"

    # Unknown ticket.
    assert c.post(f"/api/v1/approvals/{'0' * 32}/approve", {}, content_type="application/json").status_code == 404

    # A session whose user has no TOTP device any more: no longer a verified session (as in the admin itself).
    TOTPDevice.objects.filter(user=approver.user).delete()
    other = mint_ticket(alice, {"agent_id": "host-1", "key": "other"})
    r = c.post(f"/api/v1/approvals/{other}/reject", {}, content_type="application/json")
    assert r.status_code == 401, r.content
    assert Approval.objects.get(pk=other).status == "pending"


def test_every_refused_review_attempt_is_audited(mcp, tagged_agent, make_user):
    """The docs promise an audit row for every review attempt: one by a signed-in, freshly proved staff user whose
    roles grant no Approval:Approve, and one on a ticket the reviewer may not see (or that does not exist), left
    none — a probe of the queue went unrecorded."""
    from approvals.services import review
    from yuzu.errors import YuzuError

    tid = mint_ticket(mcp("alice"))
    vera = approver_principal(make_user, "vera", "Viewer")
    with pytest.raises(YuzuError):
        review(vera, tid, Approval.APPROVED, "x")
    row = audits("approval.approve", principal="vera")[-1]
    assert (row.result, row.target_id) == ("denied", tid) and "Approval:Approve" in row.detail
    carol = approver_principal(make_user, "carol", "Approver")
    with pytest.raises(YuzuError):
        review(carol, "0" * 32, Approval.REJECTED, "x")
    row = audits("approval.reject", principal="carol")[-1]
    assert (row.result, row.target_id) == ("denied", "0" * 32) and "not found" in row.detail
    assert Approval.objects.get(pk=tid).status == Approval.PENDING


def test_a_renamed_submitter_cannot_approve_their_own_ticket(mcp, tagged_agent, make_user):
    """Reviewer ≠ submitter compared account names only: the submitter's account renamed (by themselves, as an
    administrator, or by anyone) after asking, they approved their own ticket. The asking token's account counts."""
    from django.contrib.auth import get_user_model

    from approvals.services import review
    from yuzu.errors import YuzuError

    carol = approver_principal(make_user, "carol", "Approver")
    asking = McpClient(mint_for(carol.user))
    asking.initialize()
    tid = mint_ticket(asking)
    get_user_model().objects.filter(pk=carol.user.pk).update(username="carol2")
    carol.user.refresh_from_db()
    with pytest.raises(YuzuError, match="the reviewer must differ from the submitter"):
        review(carol, tid, Approval.APPROVED, "mine")
    assert Approval.objects.get(pk=tid).status == Approval.PENDING


def mint_for(user, tier="operator"):
    """A token of an existing account (an approver's own), with the Operator role."""
    RoleAssignment.objects.get_or_create(user=user, role=Role.objects.get(name="Operator"), group=None)
    return ApiToken.mint(user, "own", mcp_tier=tier, expires_at=timezone.now() + timedelta(days=30))[1]


# --- the admin Approvals page --------------------------------------------------------------------

def test_admin_lists_pending_tickets_read_only(mcp, tagged_agent, approver):
    alice = mcp("alice")
    tid = mint_ticket(alice)
    done = Approval.objects.create(definition_id="mcp.delete_tag", submitted_by="bob", scope_expression="{}",
                                   status=Approval.REJECTED)
    old = Approval.objects.create(definition_id="mcp.delete_tag", submitted_by="bob", scope_expression="{}",
                                  submitted_at=timezone.now() - APPROVAL_LIFETIME - timedelta(minutes=1))
    c = admin_client(approver.user, approver.device)
    index = c.get("/admin/")
    assert index.status_code == 200 and "Approvals (1 pending)" in index.content.decode()

    page = c.get("/admin/approvals/approval/")
    assert page.status_code == 200
    text = html.unescape(page.content.decode())
    # Pending only by default; a ticket past its lifetime has left the queue even before the sweep.
    assert tid[:8] in text and done.id[:8] not in text and old.id[:8] not in text
    assert "Delete tag owner=payments from host-1 (host-1)" in text  # what will happen, in words
    assert ">delete_tag · " in text and "alice" in text and "operator token · test 0" in text
    assert "ago" in text and "in 6\xa0days" in text and "yuzu-risk-destructive" in text
    assert f"/admin/approvals/approval/{tid}/review/" in text
    assert "Reject selected tickets" in text
    assert done.id[:8] in html.unescape(c.get("/admin/approvals/approval/?status=all").content.decode())

    # Read-only: no add, no change, no delete; the change page is the review page.
    assert c.get("/admin/approvals/approval/add/").status_code == 403
    assert c.get(f"/admin/approvals/approval/{tid}/change/")["Location"] == f"/admin/approvals/approval/{tid}/review/"
    assert c.post(f"/admin/approvals/approval/{tid}/delete/", {"post": "yes"}).status_code == 403
    assert Approval.objects.get(pk=tid).status == "pending"

    review_page = c.get(f"/admin/approvals/approval/{tid}/review/")
    body = html.unescape(review_page.content.decode())
    assert review_page.status_code == 200 and 'id="approve-button"' in body and 'id="reject-button"' in body
    assert "csrfmiddlewaretoken" in body
    assert "Runs on exactly this agent — pinned" in body and "<code>host-1</code>" in body
    assert "these 1 agent" not in body and "on the agent listed above" in body  # one agent is not 'these 1'
    assert '"agent_id": "host-1",\n  "key": "owner"' in body  # the raw arguments, folded
    assert 'id="id_otp_token"' not in body  # the proof is fresh: no code needed
    # A page number int() cannot read ("²" passes str.isdigit) is the first page, not a 500 (a probe).
    assert c.get(f"/admin/approvals/approval/{tid}/review/?page=%C2%B2").status_code == 200


def test_admin_review_with_a_stale_proof_takes_the_code_in_the_same_post(mcp, tagged_agent, approver):
    alice = mcp("alice")
    tid = mint_ticket(alice)
    c = admin_client(approver.user, approver.device)
    make_stale(c)
    review_url = f"/admin/approvals/approval/{tid}/review/"
    page = html.unescape(c.get(review_url).content.decode())
    assert 'id="id_otp_token"' in page and "Authenticator code" in page

    # Without a code: refused, nothing changes, the comment is kept, the page says why.
    r = c.post(review_url, {"decision": "approve", "comment": "change CHG-1"})
    assert r.status_code == 200 and Approval.objects.get(pk=tid).status == "pending"
    assert "older than five minutes" in page_text(r) and "change CHG-1" in r.content.decode()
    assert audits("approval.approve")[-1].detail == "approver_assurance:mfa_proof_missing"
    # A wrong code: refused the same way, named as an authenticator code.
    r = c.post(review_url, {"decision": "approve", "comment": "change CHG-1", "otp_token": "000000"})
    assert "that authenticator code is not right" in page_text(r) and Approval.objects.get(pk=tid).status == "pending"
    approver.device.refresh_from_db()
    approver.device.throttle_reset()  # django-otp throttles a device after a wrong code
    # GET never changes anything (issue 10 item 12): there is no resume-on-GET any more.
    assert c.get(review_url + "?resume=1").status_code == 200 and Approval.objects.get(pk=tid).status == "pending"

    r = c.post(review_url, {"decision": "approve", "comment": "change CHG-1", "otp_token": next_code(approver.device)})
    assert r.status_code == 302 and r["Location"] == "/admin/approvals/approval/"
    t = Approval.objects.get(pk=tid)
    assert (t.status, t.reviewed_by, t.review_comment) == ("approved", "carol", "change CHG-1")
    assert audits("approval.approve")[-1].result == "success"
    listing = c.get("/admin/approvals/approval/").content.decode()
    assert f"(ticket {tid}, submitted by alice)" in listing and "Approvals (0 pending)" in listing

    result_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert not Tag.objects.filter(key="owner").exists()


def test_admin_bulk_reject_asks_for_a_comment_and_a_code(mcp, tagged_agent, approver):
    alice = mcp("alice")
    first = mint_ticket(alice)
    second = mint_ticket(alice, {"agent_id": "host-1", "key": "other"})
    c = admin_client(approver.user, approver.device)
    make_stale(c)
    form = {"action": "reject_selected", "_selected_action": [first, second]}
    confirm = c.post("/admin/approvals/approval/", form)
    assert confirm.status_code == 200 and "reject these 2 pending tickets?" in page_text(confirm)
    assert Approval.objects.filter(status="pending").count() == 2
    r = c.post("/admin/approvals/approval/", {**form, "confirm": "yes", "comment": "freeze", "otp_token": "000000"})
    assert "that authenticator code is not right" in page_text(r)
    assert Approval.objects.filter(status="pending").count() == 2
    approver.device.refresh_from_db()
    approver.device.throttle_reset()  # django-otp throttles a device after a wrong code
    r = c.post("/admin/approvals/approval/", {**form, "confirm": "yes", "comment": "freeze",
                                              "otp_token": next_code(approver.device)})
    assert r.status_code == 302
    assert set(Approval.objects.values_list("status", "review_comment")) == {("rejected", "freeze")}
    assert audits("approval.reject")[-1].result == "success"


def test_admin_shows_review_refusals(mcp, tagged_agent, approver, make_user):
    alice = mcp("alice")
    tid = mint_ticket(alice)
    c = admin_client(approver.user, approver.device)
    own = Approval.objects.create(definition_id="mcp.delete_tag", submitted_by="carol", scope_expression="{}",
                                  origin=Approval.ORIGIN_REST)
    page = c.get(f"/admin/approvals/approval/{own.id}/review/")
    assert 'id="approve-button"' not in page.content.decode()
    assert "the reviewer must differ from the submitter" in page_text(page)
    r = c.post(f"/admin/approvals/approval/{own.id}/review/", {"decision": "approve", "comment": ""})
    assert r.status_code == 200
    assert "the reviewer must differ from the submitter" in page_text(r)
    assert Approval.objects.get(pk=own.id).status == "pending"

    r = c.post(f"/admin/approvals/approval/{tid}/review/", {"decision": "reject", "comment": "not during freeze"})
    assert r.status_code == 302
    t = Approval.objects.get(pk=tid)
    assert (t.status, t.review_comment) == ("rejected", "not during freeze")
    assert audits("approval.reject")[-1].result == "success"
    r = c.post(f"/admin/approvals/approval/{tid}/review/", {"decision": "approve"})
    assert "only pending approvals can be reviewed (this one is rejected)" in page_text(r)
    assert c.post(f"/admin/approvals/approval/{tid}/review/", {"decision": "maybe"}).status_code == 400

    # A staff Viewer has the Approvals page (Approval:Read) but sees only its own tickets and reviews none.
    viewer = make_user("vera", "Viewer", password=PASSWORD)
    viewer.is_staff = True
    viewer.save(update_fields=["is_staff"])
    vdev = TOTPDevice.objects.create(user=viewer, name="phone", confirmed=True)
    vc = admin_client(viewer, vdev)
    fresh = mint_ticket(alice, {"agent_id": "host-1", "key": "other"})
    listing = vc.get("/admin/approvals/approval/")
    assert listing.status_code == 200 and fresh[:8] not in listing.content.decode()
    assert "Reject selected tickets" not in listing.content.decode()
    assert vc.post(f"/admin/approvals/approval/{fresh}/review/", {"decision": "approve"}).status_code == 404
    assert Approval.objects.get(pk=fresh).status == "pending"

    # Staff without Approval:Read do not see the page.
    nobody = make_user("ned", password=PASSWORD)
    nobody.is_staff = True
    nobody.save(update_fields=["is_staff"])
    ndev = TOTPDevice.objects.create(user=nobody, name="phone", confirmed=True)
    nc = admin_client(nobody, ndev)
    assert nc.get("/admin/approvals/approval/").status_code == 403
    assert nc.get(f"/admin/approvals/approval/{fresh}/review/").status_code == 403


# --- revoking an approved, unused ticket (reviewer) and withdrawing it (submitter) ----------------

def _revoke(principal, tid, comment="approved by mistake"):
    from approvals.services import revoke

    return revoke(principal, tid, comment)


def test_a_reviewer_revokes_an_approved_unused_ticket_and_its_recall_reads_rejected(mcp, tagged_agent, approver,
                                                                                    make_user):
    """An approval given by mistake could not be taken back: the ticket stayed redeemable until used or expired."""
    alice = mcp("alice")
    tid = mint_ticket(alice)
    approve(approver, tid)
    dave = approver_principal(make_user, "dave", "Approver")  # any reviewer who may review it, not only carol
    assert _revoke(dave, tid, "wrong host") == {"id": tid, "status": "rejected"}
    t = Approval.objects.get(pk=tid)
    assert (t.status, t.reviewed_by, t.consumed_at) == ("rejected", "dave", None)
    assert t.review_comment == "revoked (approved by carol): wrong host"
    row = audits("approval.revoke")[-1]
    assert (row.result, row.principal, row.target_id) == ("success", "dave", tid)
    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert (err["code"], err["message"]) == (-32003, "approval was rejected")
    assert Tag.objects.filter(key="owner").exists() and not audits("tag.delete")
    # A second revoke, and a revoke of a pending ticket: nothing approved to take back.
    from yuzu.errors import YuzuError

    with pytest.raises(YuzuError, match=r"only an approved, unused ticket can be revoked \(this one is rejected\)"):
        _revoke(approver, tid)
    pending = mint_ticket(alice, {"agent_id": "host-1", "key": "other"})
    with pytest.raises(YuzuError, match=r"this one is pending"):
        _revoke(approver, pending)
    assert Approval.objects.get(pk=pending).status == "pending"
    assert [a.result for a in audits("approval.revoke")] == ["success", "denied", "denied"]


def test_a_used_ticket_cannot_be_revoked_or_withdrawn(mcp, tagged_agent, approver, make_user):
    from yuzu.errors import YuzuError

    alice = mcp("alice")
    tid = mint_ticket(alice)
    approve(approver, tid)
    result_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))
    with pytest.raises(YuzuError, match="already used"):
        _revoke(approver, tid)
    with pytest.raises(YuzuError, match="already used"):
        withdraw(Principal(user=make_user("alice")), tid)
    t = Approval.objects.get(pk=tid)
    assert t.status == "approved" and t.consumed_at is not None
    assert audits("approval.revoke")[-1].result == "denied" and "already used" in audits("approval.revoke")[-1].detail
    assert audits("approval.withdraw")[-1].result == "denied"


def test_who_may_not_revoke(mcp, tagged_agent, approver, make_user):
    """Only a reviewer who may review the ticket, with a fresh proof, and not its submitter; every refusal audited."""
    from fleet.models import ManagementGroup
    from yuzu.errors import NotFound, PermissionDenied, YuzuError

    alice = mcp("alice")
    tid = mint_ticket(alice)
    approve(approver, tid)
    vera = approver_principal(make_user, "vera", "Viewer")  # Approval:Read, not Approve
    with pytest.raises(PermissionDenied):
        _revoke(vera, tid)
    other = ManagementGroup.objects.create(name="other-team")
    gary = approver_principal(make_user, "gary", None)
    RoleAssignment.objects.create(user=gary.user, role=Role.objects.get(name="Approver"), group=other)
    with pytest.raises(NotFound):  # another group's reviewer: the ticket is not one it may see
        _revoke(gary, tid)
    stale = approver_principal(make_user, "dave", "Approver")
    stale.mfa_verified_at = time.time() - 3600
    with pytest.raises(PermissionDenied, match="approver_assurance_required:mfa_proof_missing"):
        _revoke(stale, tid)
    token = Principal(user=make_user("dave"))  # not an interactive session
    with pytest.raises(PermissionDenied, match="non_interactive_session"):
        _revoke(token, tid)
    # The submitter — an approver themselves — revokes nothing: they withdraw their own ticket.
    asking = McpClient(mint_for(approver.user))
    asking.initialize()
    own = mint_ticket(asking, {"agent_id": "host-1", "key": "other"})
    dave = approver_principal(make_user, "dave", "Approver")
    approve(dave, own)
    with pytest.raises(YuzuError, match="the submitter withdraws their own ticket"):
        _revoke(approver, own)
    assert Approval.objects.filter(pk__in=[tid, own], status="approved").count() == 2
    rows = audits("approval.revoke")
    assert [r.result for r in rows] == ["denied"] * 5
    assert [r.principal for r in rows] == ["vera", "gary", "dave", "dave", "carol"]
    assert "mfa_proof_missing" in rows[2].detail and "not found" in rows[1].detail


def test_revoke_and_recall_at_once_exactly_one_wins(mcp, tagged_agent, approver):
    """The recall's consume and the revoke race: either the call runs (and the revoke is refused as used) or the
    revoke stands (and the recall is refused) — never both, never neither."""
    alice = mcp("alice")
    for i in range(6):
        Tag.objects.get_or_create(agent=tagged_agent, key="owner", defaults={"value": "payments"})
        tid = mint_ticket(alice)
        approve(approver, tid)
        body = {"jsonrpc": "2.0", "id": i, "method": "tools/call",
                "params": {"name": "delete_tag", "arguments": {**ARGS, "approval_id": tid}}}
        (rk, rv), (vk, vv) = at_once(lambda body=body: request(body=body, headers=alice.headers()).json(),
                                     partial(_revoke, approver, tid))
        assert rk == "ok", rv
        ran = "result" in rv
        assert ran == (vk == "error"), (rv, vv)
        t = Approval.objects.get(pk=tid)
        if ran:
            assert "already used" in str(vv) and t.status == "approved" and t.consumed_at is not None
        else:
            assert vv == {"id": tid, "status": "rejected"} and t.consumed_at is None and t.status == "rejected"
            assert rv["error"]["code"] == -32003 and rv["error"]["message"] in ("approval was rejected", ALREADY_USED)
            assert Tag.objects.filter(key="owner").exists()
    assert len(audits("tag.delete")) == Approval.objects.filter(consumed_at__isnull=False).count()


def test_the_submitter_withdraws_an_approved_unused_ticket_over_mcp_and_rest(mcp, tagged_agent, approver, mint):
    alice = mcp("alice")
    first = mint_ticket(alice)
    approve(approver, first)
    res = result_of(alice.call("withdraw_approval", {"approval_id": first}))
    assert res["structuredContent"] == {"id": first, "status": "withdrawn"}
    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": first}))
    assert (err["code"], err["message"]) == (-32003, "approval was withdrawn")
    second = mint_ticket(alice)
    approve(approver, second)
    rest = Client(HTTP_AUTHORIZATION=f"Bearer {mint('alice', role='Operator')}")
    r = rest.post(f"/api/v1/approvals/{second}/withdraw", {}, content_type="application/json")
    assert r.status_code == 200 and r.json()["data"] == {"id": second, "status": "withdrawn"}
    # The approver's review stays on the row; the withdrawal is audited.
    t = Approval.objects.get(pk=second)
    assert (t.status, t.reviewed_by) == ("withdrawn", "carol")
    assert [a.result for a in audits("approval.withdraw")] == ["success", "success"]
    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": second}))
    assert err["message"] == "approval was withdrawn" and Tag.objects.filter(key="owner").exists()
    # Someone else's approved ticket still reads as not found; a rejected one cannot be withdrawn.
    bob = mcp("bob")
    third = mint_ticket(alice)
    approve(approver, third)
    assert error_of(bob.call("withdraw_approval", {"approval_id": third}))["message"].startswith("approval not found")
    assert Approval.objects.get(pk=third).status == "approved"


def test_withdraw_and_recall_at_once_exactly_one_wins(mcp, tagged_agent, approver, make_user):
    alice = mcp("alice")
    submitter = Principal(user=make_user("alice"))
    for i in range(4):
        Tag.objects.get_or_create(agent=tagged_agent, key="owner", defaults={"value": "payments"})
        tid = mint_ticket(alice)
        approve(approver, tid)
        body = {"jsonrpc": "2.0", "id": i, "method": "tools/call",
                "params": {"name": "delete_tag", "arguments": {**ARGS, "approval_id": tid}}}
        (rk, rv), (wk, wv) = at_once(lambda body=body: request(body=body, headers=alice.headers()).json(),
                                     partial(withdraw, submitter, tid))
        assert rk == "ok", rv
        assert ("result" in rv) == (wk == "error"), (rv, wv)
        t = Approval.objects.get(pk=tid)
        assert (t.consumed_at is not None) == ("result" in rv)
        assert t.status == ("approved" if "result" in rv else "withdrawn")


def test_admin_review_page_revokes_an_approved_ticket_with_a_fresh_code(mcp, tagged_agent, approver, make_user):
    alice = mcp("alice")
    tid = mint_ticket(alice)
    approve(approver, tid)
    c = admin_client(approver.user, approver.device)
    make_stale(c)
    url = f"/admin/approvals/approval/{tid}/review/"
    page = html.unescape(c.get(url).content.decode())
    assert 'id="revoke-button"' in page and 'id="approve-button"' not in page and 'id="id_otp_token"' in page
    assert "csrfmiddlewaretoken" in page
    # Stale proof and no code: refused, nothing changes.
    r = c.post(url, {"decision": "revoke", "comment": "wrong host"})
    assert r.status_code == 200 and "older than five minutes" in page_text(r)
    assert Approval.objects.get(pk=tid).status == "approved"
    assert audits("approval.revoke")[-1].detail == "approver_assurance:mfa_proof_missing"
    # Without the CSRF token: refused before anything.
    strict = Client(enforce_csrf_checks=True)
    strict.cookies = c.cookies
    assert strict.post(url, {"decision": "revoke", "otp_token": next_code(approver.device)}).status_code == 403
    assert Approval.objects.get(pk=tid).status == "approved"
    approver.device.refresh_from_db()
    approver.device.throttle_reset()
    r = c.post(url, {"decision": "revoke", "comment": "wrong host", "otp_token": next_code(approver.device)})
    assert r.status_code == 302 and r["Location"] == "/admin/approvals/approval/"
    t = Approval.objects.get(pk=tid)
    assert (t.status, t.reviewed_by) == ("rejected", "carol")
    assert t.review_comment == "revoked (approved by carol): wrong host"
    assert audits("approval.revoke")[-1].result == "success"
    assert "revoked" in page_text(c.get("/admin/approvals/approval/?status=all"))
    assert 'id="revoke-button"' not in c.get(url).content.decode()
    err = error_of(alice.call("delete_tag", {**ARGS, "approval_id": tid}))
    assert err["message"] == "approval was rejected"


def test_admin_review_page_offers_no_revoke_to_the_submitter(mcp, tagged_agent, approver, make_user):
    asking = McpClient(mint_for(approver.user))
    asking.initialize()
    own = mint_ticket(asking)
    approve(approver_principal(make_user, "dave", "Approver"), own)
    c = admin_client(approver.user, approver.device)
    url = f"/admin/approvals/approval/{own}/review/"
    assert 'id="revoke-button"' not in c.get(url).content.decode()
    r = c.post(url, {"decision": "revoke", "comment": "mine"})
    assert r.status_code == 200 and "the submitter withdraws their own ticket" in page_text(r)
    assert Approval.objects.get(pk=own).status == "approved"


def test_a_schedules_standing_approval_is_not_revoked_here(approver, make_user):
    """A schedule caches its approval when it first fires: revoking the ticket would not stop it — refused, with
    the way that does (disable or delete the schedule)."""
    from yuzu.errors import YuzuError

    t = Approval.objects.create(definition_id="schedule.x", submitted_by="alice", scope_expression='{"schedule_id":1}',
                                origin=Approval.ORIGIN_SCHEDULE, status=Approval.APPROVED, reviewed_by="carol")
    with pytest.raises(YuzuError, match="disable or delete the schedule"):
        _revoke(approver, t.id)
    with pytest.raises(YuzuError, match="disable or delete the schedule"):
        withdraw(Principal(user=make_user("alice")), t.id)
    assert Approval.objects.get(pk=t.id).status == "approved"


def test_rest_revoke_needs_a_fresh_interactive_session(mcp, tagged_agent, approver, mint):
    alice = mcp("alice")
    tid = mint_ticket(alice)
    approve(approver, tid)
    url = f"/api/v1/approvals/{tid}/revoke"
    r = Client(HTTP_AUTHORIZATION=f"Bearer {mint('dave', role='Approver')}").post(url, {"comment": "x"},
                                                                                  content_type="application/json")
    assert r.status_code == 403 and r.json()["error"]["message"].endswith("non_interactive_session")
    c = admin_client(approver.user, approver.device)
    make_stale(c)
    r = c.post(url, {"comment": "x"}, content_type="application/json")
    assert r.status_code == 403 and r.json()["error"]["message"].endswith("mfa_proof_missing")
    s = c.session
    s[MFA_SESSION_KEY] = time.time()
    s.save()
    r = c.post(url, {"comment": "wrong host"}, content_type="application/json")
    assert r.status_code == 200 and r.json()["data"] == {"id": tid, "status": "rejected"}
    assert c.post(url, {}, content_type="application/json").status_code == 400
    assert [a.result for a in audits("approval.revoke")] == ["denied", "denied", "success", "denied"]
