"""The approval surface in a real browser: Debian's chromium driven by Playwright against a real daphne.

An MCP client (alice, operator tier) asks to delete a tag and gets a pending ticket (-32006). An approver
(carol, Approver role, staff, TOTP device) logs in to the admin with password + authenticator code in one
submission, opens Approvals, sees what the ticket will do, presses Approve with a stale MFA proof, is asked
for the authenticator code on the same page, approves with it; alice's recall (same tool + arguments +
approval_id) then deletes the tag.

Needs /usr/bin/chromium (`apt-get install -y chromium`; tests/support/system_deps.py installs it under `make test`)
and the playwright package (requirements-test.txt). `playwright install` is never needed or used.
"""

import os
import re
import time
from pathlib import Path

import pytest
from django.contrib.sessions.backends.db import SessionStore

from approvals.models import Approval
from fleet.models import Agent, Tag
from tests.support.browser import (
    McpHttp,
    admin_login,
    chromium,
    off_thread,
    open_page,
    require_browser,
    staff_with_authenticator,
)
from tests.support.otp import next_code
from yuzu.auth import MFA_SESSION_KEY
from yuzu.models import AuditEvent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

PASSWORD = "approver-password-1"
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
ARGS = {"agent_id": "host-1", "key": "owner"}


def make_proof_stale(session_key):
    session = SessionStore(session_key=session_key)
    assert session.get(MFA_SESSION_KEY) is not None
    session[MFA_SESSION_KEY] = time.time() - 3600
    session.save()


def ticket_status(approval_id):
    return Approval.objects.get(pk=approval_id).status


def test_approver_approves_in_the_admin_after_step_up(daphne, make_user, mint, tmp_path):
    require_browser()  # fails before any set-up when chromium is missing

    agent = Agent.objects.create(agent_id="host-1", hostname="host-1")
    Tag.objects.create(agent=agent, key="owner", value="payments")
    token = mint("alice", role="Operator", tier="operator")
    device = staff_with_authenticator(make_user, "carol", "Approver", PASSWORD)

    server = daphne()
    alice = McpHttp(server, token)
    err = alice.call("delete_tag", ARGS)["error"]
    assert err["code"] == -32006, err
    tid = err["data"]["approval_id"]

    with chromium() as browser:
        page = open_page(browser, server.base)

        # Password + authenticator code in one submission (carol has one device).
        admin_login(page, server.base, "/admin/", "carol", PASSWORD, device)

        # Deterministically stale: move this session's MFA proof an hour back in the session store.
        sid = next(c["value"] for c in page.context.cookies() if c["name"] == "sessionid")
        off_thread(make_proof_stale, sid)

        # The header shows the queue; the Approvals page lists the ticket.
        page.click("#yuzu-pending-approvals a")
        page.wait_for_url(f"{server.base}/admin/approvals/approval/")
        assert page.inner_text("#yuzu-pending-approvals") == "Approvals (1 pending)"
        row = page.locator("#result_list tbody tr", has_text=tid[:8])
        assert row.count() == 1
        row_text = row.inner_text()
        assert "Delete tag owner=payments from host-1 (host-1)" in row_text
        assert "delete_tag" in row_text and "alice" in row_text and "ago" in row_text
        page.screenshot(path=str(tmp_path / "approvals.png"), full_page=True)

        # Review → Approve with a comment but no code: the proof is stale, the page says so.
        row.locator("a.yuzu-review-link").click()
        page.wait_for_url(f"{server.base}/admin/approvals/approval/{tid}/review/")
        assert page.inner_text("#ticket-tool") == "delete_tag"
        assert page.inner_text("#ticket-submitter") == "alice"
        assert page.inner_text("#ticket-client") == "browser-test 0"
        assert "host-1" in page.inner_text("#ticket-targets")
        page.fill("#id_comment", "CHG-42: owner tag retired")
        page.click("#approve-button")
        page.wait_for_selector(".messagelist")
        assert "older than five minutes" in page.inner_text(".messagelist")
        assert off_thread(ticket_status, tid) == "pending"

        # The authenticator code in the same form (a later time step than the login's) → approved.
        page.fill("#id_otp_token", off_thread(next_code, device))
        page.click("#approve-button")
        page.wait_for_url(f"{server.base}/admin/approvals/approval/")
        assert f"Approved: Delete tag owner=payments from host-1 (host-1) (ticket {tid}" in \
            page.inner_text(".messagelist")
        assert page.inner_text("#yuzu-pending-approvals") == "Approvals (0 pending)"
        page.screenshot(path=str(tmp_path / "approvals-after.png"), full_page=True)

    ticket = Approval.objects.get(pk=tid)
    assert (ticket.status, ticket.reviewed_by, ticket.review_comment) == ("approved", "carol",
                                                                          "CHG-42: owner tag retired")
    assert list(AuditEvent.objects.filter(action="approval.approve").order_by("id").values_list("result", flat=True)) \
        == ["denied", "success"]  # the stale attempt, then the approval after step-up

    # The recall runs the tool: the tag is gone.
    done = alice.call("delete_tag", {**ARGS, "approval_id": tid})
    assert "error" not in done, done
    assert done["result"]["structuredContent"] == {"agent_id": "host-1", "key": "owner", "deleted": True}
    assert not Tag.objects.filter(agent_id="host-1", key="owner").exists()
    assert Approval.objects.get(pk=tid).consumed_by == "alice"


def test_approver_revokes_an_approved_unused_ticket_after_step_up(daphne, make_user, mint, tmp_path):
    """Approved by mistake: the review page of the approved, unused ticket offers Revoke approval (reason, and the
    authenticator code when the proof is stale); the submitter's recall is then refused and nothing runs."""
    require_browser()
    from approvals.services import review
    from yuzu.rbac import Principal

    agent = Agent.objects.create(agent_id="host-1", hostname="host-1")
    Tag.objects.create(agent=agent, key="owner", value="payments")
    token = mint("alice", role="Operator", tier="operator")
    device = staff_with_authenticator(make_user, "carol", "Approver", PASSWORD)

    server = daphne()
    alice = McpHttp(server, token)
    tid = alice.call("delete_tag", ARGS)["error"]["data"]["approval_id"]
    review(Principal(user=device.user, via="session", mfa_verified_at=time.time()), tid, Approval.APPROVED, "ok")

    with chromium() as browser:
        page = open_page(browser, server.base)
        admin_login(page, server.base, "/admin/", "carol", PASSWORD, device)
        sid = next(c["value"] for c in page.context.cookies() if c["name"] == "sessionid")
        off_thread(make_proof_stale, sid)

        page.goto(f"{server.base}/admin/approvals/approval/{tid}/review/")
        assert page.locator("#approve-button").count() == 0
        page.fill("#id_comment", "wrong host")
        page.click("#revoke-button")
        page.wait_for_selector(".messagelist")
        assert "older than five minutes" in page.inner_text(".messagelist")
        assert off_thread(ticket_status, tid) == "approved"

        page.fill("#id_otp_token", off_thread(next_code, device))
        page.click("#revoke-button")
        page.wait_for_url(f"{server.base}/admin/approvals/approval/")
        assert f"Approval revoked: Delete tag owner=payments from host-1 (host-1) (ticket {tid}" in \
            page.inner_text(".messagelist")
        page.screenshot(path=str(tmp_path / "approvals-revoked.png"), full_page=True)

    ticket = Approval.objects.get(pk=tid)
    assert (ticket.status, ticket.review_comment) == ("rejected", "revoked (approved by carol): wrong host")
    assert list(AuditEvent.objects.filter(action="approval.revoke").order_by("id").values_list("result", flat=True)) \
        == ["denied", "success"]
    err = alice.call("delete_tag", {**ARGS, "approval_id": tid})["error"]
    assert (err["code"], err["message"]) == (-32003, "approval was rejected")
    assert Tag.objects.filter(agent_id="host-1", key="owner").exists()


def test_the_review_page_names_invisible_characters_in_a_real_browser(daphne, make_user, mint, tmp_path):
    """A submitter's bundle names plugins with a zero-width space, a word joiner and a tag character in them: in
    chromium they draw nothing, so 'os<U+200B>.info' would read as 'os.info'. The review page shows each by its
    code point in the summary, the title and the steps, the rendered text holds none of them, and the plain ASCII
    around them is as typed. With YUZU_DOCS_SCREENSHOTS=1 the page is written to docs/img/approval-hidden.png."""
    require_browser()
    Agent.objects.create(agent_id="a1", hostname="web-1", connected=True)
    token = mint("sam", role="Administrator", tier="supervised")
    device = staff_with_authenticator(make_user, "carol", "Approver", PASSWORD)
    server = daphne()
    err = McpHttp(server, token).call("execute_bundle", {"agent_id": "a1", "steps": [
        {"plugin": "os\u200b", "action": "info"}, {"plugin": "service", "action": "restart\u2060\U000e0041"}]})["error"]
    assert err["code"] == -32006, err
    tid = err["data"]["approval_id"]

    with chromium() as browser:
        page = open_page(browser.new_context(base_url=server.base, viewport={"width": 1200, "height": 800}))
        admin_login(page, server.base, "/admin/", "carol", PASSWORD, device)
        page.goto(f"{server.base}/admin/approvals/approval/{tid}/review/")
        summary, steps = page.inner_text("#ticket-summary"), page.inner_text("#approval-ticket")
        body = page.inner_text("body")
        for shown in (summary, steps, body, page.title()):
            assert not re.search("[\u200b\u2060\U000e0000-\U000e0fff]", shown), shown
        assert "os<U+200B>.info" in summary and "service.restart<U+2060><U+E0041>" in summary
        assert "os<U+200B>.info" in steps and "service.restart<U+2060><U+E0041>" in steps
        assert "os<U+200B>.info" in page.title()
        assert "web-1" in page.inner_text("#ticket-targets")
        page.screenshot(path=str(tmp_path / "approval-hidden.png"), full_page=True)
        if os.environ.get("YUZU_DOCS_SCREENSHOTS") == "1":
            page.screenshot(path=str(DOCS_IMG / "approval-hidden.png"), full_page=True)

        # the queue names them too
        page.goto(f"{server.base}/admin/approvals/approval/")
        row = page.locator("#result_list tbody tr", has_text=tid[:8]).inner_text()
        assert "os<U+200B>.info" in row and "\u200b" not in row
