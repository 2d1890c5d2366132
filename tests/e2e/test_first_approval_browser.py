"""A new install completes its first approval, exactly as docs/approvals.md walks a newcomer through it.

`bootstrap` prints the administrator's credentials and authenticator URI and the AI client's own token;
a real agent is connected; the client (with the printed token) asks to run os.info and gets a ticket; the
administrator signs in with the printed password and a code from the printed authenticator secret (one
submission), opens the queue from the header, reads the review page and approves; the client's recall runs
once on the real agent and the result comes back.

With YUZU_DOCS_SCREENSHOTS=1 the queue and review pages are also written to docs/img/ (the committed
screenshots come from this test).
"""

import base64
import io
import os
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core.management import call_command
from django_otp.oath import totp

from approvals.models import Approval
from fleet.models import Agent, Execution
from tests.support.browser import McpHttp, chromium, open_page, require_browser
from tests.support.stack import Stack, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def printed(out):
    """What bootstrap printed: the admin's username, password and authenticator secret, and the MCP token."""
    text = out.getvalue()
    username = re.search(r"username:\s+(\S+)", text).group(1)
    password = re.search(r"password:\s+(\S+)", text).group(1)
    uri = re.search(r"(otpauth://\S+)", text).group(1)
    token = re.search(r"\b(yuzu_[0-9a-f]{64})\b", text).group(1)
    secret = parse_qs(urlsplit(uri).query)["secret"][0]
    return username, password, base64.b32decode(secret + "=" * (-len(secret) % 8)), token, text


def authenticator(key):
    """What the administrator's authenticator app shows now (the next step's code if this one was just used)."""
    return lambda step=0: f"{totp(key, t0=0, step=30, drift=step):06d}"


def test_a_fresh_install_completes_its_first_approval(daphne, tmp_path):
    require_browser()  # fails before any set-up when chromium is missing
    stack = Stack(daphne(), tmp_path)
    try:
        server = stack.server
        out = io.StringIO()
        call_command("bootstrap", "--no-qr", "--url", server.base, stdout=out)
        username, password, key, token, text = printed(out)
        assert username == "admin" and "'claude' (Operator role, no password)" in text
        code = authenticator(key)
        _, agent_id = stack.agent()

        # The AI client asks for something that needs a human: a ticket, not a run.
        client = McpHttp(server, token)
        args = {"plugin": "os", "action": "info", "agent_ids": [agent_id]}
        err = client.call("execute_instruction", args)["error"]
        assert err["code"] == -32006, err
        tid = err["data"]["approval_id"]
        assert not Execution.objects.exists()
        summary = f"Run os.info on {Agent.objects.get(pk=agent_id).hostname}"  # up to three agents by name

        with chromium() as browser:
            page = open_page(browser, server.base, {"width": 1280, "height": 800})
            # Sign in with what bootstrap printed, in one submission.
            page.goto("/admin/")
            page.fill("#id_username", username)
            page.fill("#id_password", password)
            page.fill("#id_otp_token", code())
            page.click("input[type=submit]")
            page.wait_for_url(f"{server.base}/admin/")

            # The header says a ticket waits; the queue says what it will do.
            assert page.inner_text("#yuzu-pending-approvals") == "Approvals (1 pending)"
            page.click("#yuzu-pending-approvals a")
            page.wait_for_url(f"{server.base}/admin/approvals/approval/")
            row = page.locator("#result_list tbody tr", has_text=tid[:8])
            assert summary in row.inner_text() and "claude" in row.inner_text()
            shoot(page, tmp_path, "approvals-queue.png")

            # The review page: what, where, who, how risky; then approve (the sign-in proof is fresh).
            row.locator("a.yuzu-review-link").click()
            page.wait_for_url(f"{server.base}/admin/approvals/approval/{tid}/review/")
            assert page.inner_text("#ticket-summary") == summary
            assert "Reports the operating system" in page.inner_text("#ticket-description")
            assert agent_id in page.inner_text("#ticket-targets")
            assert page.inner_text("#ticket-token") == "bootstrap MCP (supervised) (supervised tier)"
            assert page.locator("#id_otp_token").count() == 0
            page.fill("#id_comment", "first approval")
            shoot(page, tmp_path, "approval-review.png")
            page.click("#approve-button")
            page.wait_for_url(f"{server.base}/admin/approvals/approval/")
            assert f"Approved: {summary}" in page.inner_text(".messagelist")

        ticket = Approval.objects.get(pk=tid)
        assert (ticket.status, ticket.reviewed_by, ticket.submitted_by) == ("approved", "admin", "claude")

        # The recall runs once, on the real agent, and the answer comes back.
        receipt = client.call("execute_instruction", {**args, "approval_id": tid})["result"]["structuredContent"]
        eid = receipt["execution_id"]
        done = wait_for(lambda: Execution.objects.filter(pk=eid, status="succeeded").exists(), 30,
                        "the approved execution to succeed", stack.logs)
        assert done
        rows = client.call("query_responses", {"execution_id": eid})["result"]["structuredContent"]["responses"]
        assert [r["status"] for r in rows] == ["SUCCESS"] and '"system"' in rows[0]["output"]
        again = client.call("execute_instruction", {**args, "approval_id": tid})["error"]
        assert again["code"] == -32003 and again["message"] == "approval already used (one-time ticket)"
    finally:
        stack.close()


def shoot(page, tmp_path, name):
    page.screenshot(path=str(tmp_path / name), full_page=True)
    if os.environ.get("YUZU_DOCS_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(exist_ok=True)
        page.screenshot(path=str(DOCS_IMG / name), full_page=True)
