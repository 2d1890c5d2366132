"""Approvers hear about a new ticket (approvals/notify.py, docs/approvals.md#notifications): a signed JSON
webhook, retried with exponential backoff a bounded number of times, and email to the users who may approve.

The webhook receiver is a real HTTP server on a free port in this process. Tickets are minted through the
real MCP gate (in-process ASGI) or created in committed transactions. In-process tests run Celery eagerly
(as embedded mode does: the notification tasks then run on a background thread); the live test runs a real
Celery worker on Redis (YUZU_REDIS_URL) and shows the retries happen there."""

import gc
import hashlib
import hmac
import itertools
import json
import logging
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import mail
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from prometheus_client import REGISTRY

from approvals.models import Approval
from fleet.models import Agent, ManagementGroup, Tag
from tests.support.mcp_http import McpClient
from yuzu.models import AuditEvent
from yuzu.testing import ROOT, server_env, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec-test-0123456789abcdef"
ARGS = {"agent_id": "host-1", "key": "owner"}
PASSWORDISH = "hunter2-do-not-leak"
PUBLIC = "https://yuzu.example.test"
SECRET_PATH = "/services/T000/B000/pathsecret42"


@pytest.fixture(autouse=True)
def _release_worker_connections():
    """In-process MCP calls (and eager notification threads) use short-lived threads with their own
    database connections: collect them after each test so PostgreSQL is not left with idle ones."""
    yield
    gc.collect()


class Receiver:
    """A real HTTP endpoint: answers each POST with the next of ``statuses`` (the last one repeats),
    optionally after holding the request until ``release`` is set; records every request."""

    def __init__(self, statuses=(200,), hold=False):
        self.statuses, self.hold = list(statuses), hold
        self.release = threading.Event()
        self.requests = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append({"at": time.monotonic(), "path": self.path,
                                          "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
                if receiver.hold:
                    receiver.release.wait(30)
                status = receiver.statuses[min(len(receiver.requests) - 1, len(receiver.statuses) - 1)]
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{SECRET_PATH}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    made = []

    def make(*statuses, hold=False):
        r = Receiver(statuses or (200,), hold=hold)
        made.append(r)
        return r

    yield make
    for r in made:
        r.stop()


def webhook_settings(url, **extra):
    return override_settings(YUZU_APPROVAL_WEBHOOK_URL=url, YUZU_APPROVAL_WEBHOOK_SECRET=SECRET,
                             YUZU_PUBLIC_URL=PUBLIC, YUZU_APPROVAL_EMAIL=False,
                             **{"YUZU_APPROVAL_NOTIFY_BACKOFF": 0.3, "YUZU_APPROVAL_NOTIFY_ATTEMPTS": 3, **extra})


@pytest.fixture
def alice(mint):
    Tag.objects.create(agent=Agent.objects.create(agent_id="host-1", hostname="host-1"), key="owner", value="p")
    client = McpClient(mint("alice", role="Operator", tier="operator"))
    client.initialize()
    return client


def mint_ticket(client):
    started = time.monotonic()
    r = client.call("delete_tag", ARGS)
    elapsed = time.monotonic() - started
    err = r.json()["error"]
    assert err["code"] == -32006, err
    return err["data"]["approval_id"], elapsed


def committed_ticket(**fields):
    """A ticket created in its own committed transaction, with arguments holding a secret value."""
    summary = fields.pop("summary", None)
    fields = {"definition_id": "mcp.set_tag", "submitted_by": "alice",
              "scope_expression": json.dumps({"agent_id": "host-1", "password": PASSWORDISH}), **fields}
    ticket = Approval(**fields)
    if summary is not None:
        ticket.summary = summary  # the field the review work adds; notify reads it with getattr
    with transaction.atomic():
        ticket.save()
    return ticket


def counted(channel, outcome):
    return REGISTRY.get_sample_value("yuzu_approval_notifications_total",
                                     {"channel": channel, "outcome": outcome}) or 0.0


def notify_audits(approval_id):
    return list(AuditEvent.objects.filter(action="approval.notify", target_id=approval_id).order_by("id"))


def verify(request, secret=SECRET, now=None):
    """What a receiver does: recompute HMAC-SHA256 over "<timestamp>." + raw body; refuse stale timestamps."""
    ts = request["headers"]["x-yuzu-timestamp"]
    expected = hmac.new(secret.encode(), ts.encode() + b"." + request["body"], hashlib.sha256).hexdigest()
    fresh = abs((now or time.time()) - int(ts)) <= 300
    return fresh and hmac.compare_digest(request["headers"]["x-yuzu-signature"], "sha256=" + expected)


# --- the webhook -------------------------------------------------------------------------------

def test_webhook_is_delivered_signed_and_says_what_is_asked(alice, receiver, eager_celery):
    hook = receiver(200)
    before = counted("webhook", "delivered")
    with webhook_settings(hook.url):
        tid, elapsed = mint_ticket(alice)
        wait_until(lambda: notify_audits(tid), timeout=20, what="the delivery to be audited")

    assert len(hook.requests) == 1
    req = hook.requests[0]
    assert req["path"] == SECRET_PATH
    assert req["headers"]["content-type"] == "application/json"
    assert req["headers"]["x-yuzu-event"] == "approval.requested"
    assert len(req["headers"]["x-yuzu-delivery"]) == 32
    assert verify(req)
    assert not verify(req, secret="another-secret-0123456789")
    assert not verify({**req, "body": req["body"].replace(b"alice", b"mallory")})  # the body is covered
    assert not verify({**req, "headers": {**req["headers"], "x-yuzu-timestamp": "1"}})  # so is the timestamp

    body = json.loads(req["body"])
    ticket = Approval.objects.get(pk=tid)
    assert body["approval_id"] == tid and body["tool"] == "delete_tag" and body["submitted_by"] == "alice"
    assert body["definition_id"] == "mcp.delete_tag" and body["event"] == "approval.requested"
    assert body["review_url"] == f"{PUBLIC}/admin/approvals/approval/{tid}/review/"
    assert body["expires_at"] == ticket.expires_at.isoformat()
    assert body["summary"] == ticket.summary and ticket.summary.startswith("Delete tag owner=")
    assert f"alice asks to run delete_tag: {ticket.summary}. Approval ticket {tid}, expires" in body["text"]
    assert body["review_url"] in body["text"]
    assert '"agent_id"' not in req["body"].decode() and "scope_expression" not in body  # no arguments
    assert [(a.result, a.detail) for a in notify_audits(tid)] == [("success", "channel=webhook attempts=1")]
    assert counted("webhook", "delivered") == before + 1


def test_the_notification_never_carries_argument_values_but_does_carry_the_summary(receiver, eager_celery):
    hook = receiver(200)
    with webhook_settings(hook.url):
        ticket = committed_ticket(summary="Set tag team on host-1\nand nothing else")
        wait_until(lambda: hook.requests, timeout=20, what="the webhook")
    raw = hook.requests[0]["body"].decode()
    assert PASSWORDISH not in raw and "password" not in raw
    body = json.loads(raw)
    assert body["summary"] == "Set tag team on host-1 and nothing else"  # whitespace folded to one line
    assert body["text"].startswith("alice asks to run set_tag: Set tag team on host-1 and nothing else. ")
    assert body["approval_id"] == ticket.pk
    wait_until(lambda: notify_audits(ticket.pk), timeout=20, what="the delivery to be audited")


def test_the_webhook_text_carries_no_chat_markup_from_the_submitter():
    """The webhook's text is what a Slack incoming webhook posts as it is: a summary (text the submitter controls, a
    group's name, say) holding <https://evil.example|Review it here> showed the approvers a link of the submitter's
    under a label of their choosing, and <!channel> paged the whole channel. Slack's three control characters in the
    submitter's text are escaped; our own link stays a link."""
    from approvals.notify import ticket_message

    sly = "Create group 'x' <https://evil.example/login|Review it here> <!channel> & more"
    ticket = Approval(id="a" * 32, definition_id="mcp.create_management_group", submitted_by="alice",
                      summary=sly, scope_expression="{}", submitted_at=timezone.now())
    text = ticket_message(ticket)["text"]
    assert "<https://evil" not in text and "<!channel>" not in text and "&amp; more" in text
    assert "&lt;hxxps[://]evil[.]example/login|Review it here&gt; &lt;!channel&gt;" in text  # and defanged
    assert text.endswith(f"/admin/approvals/approval/{'a' * 32}/review/")


PHISH = ("Create group 'ops' — verify first at https://yuzu-login.example/sso?next=x, HTTP://Evil.Example:8443/a, "
         "ftp://files.example/x, www.evil.example, bob@mail.example, evil。example, "
         "or os.info; version 1.2.3 on 10.0.0.1")
DEFANGED = ("Create group 'ops' — verify first at hxxps[://]yuzu-login[.]example/sso?next=x, "
            "HXXP[://]Evil[.]Example:8443/a, ftp[://]files[.]example/x, www[.]evil[.]example, bob@mail[.]example, "
            "evil[.]example, or os[.]info; version 1.2.3 on 10.0.0.1")


def test_a_url_in_the_submitters_text_reaches_no_notification_as_a_link():
    """Slack, Teams and mail clients turn a plain URL — or a bare host name like www.evil.example — into a link: a
    submitter's summary saying 'verify first at https://…' put a clickable phishing link in front of every approver,
    next to the real review link. Host names and schemes in the submitter's text are defanged the way security teams
    share indicators (hxxps[://]evil[.]example: no chat or mail client links it, a person still reads it), in the
    webhook's text and summary and in the email; version numbers and addresses stay as they are, and the review link,
    the server's own, stays the one link."""
    from approvals.notify import email_content, ticket_message

    ticket = Approval(id="b" * 32, definition_id="mcp.create_management_group", submitted_by="alice",
                      summary=PHISH, scope_expression="{}", submitted_at=timezone.now())
    with override_settings(YUZU_PUBLIC_URL=PUBLIC):
        message = ticket_message(ticket)
    review = f"{PUBLIC}/admin/approvals/approval/{'b' * 32}/review/"
    assert message["summary"] == DEFANGED
    assert message["text"] == (f"alice asks to run create_management_group: {DEFANGED}. Approval ticket {'b' * 32}, "
                               f"expires {ticket.expires_at:%Y-%m-%d %H:%M} UTC. Review it: {review}")
    subject, body = email_content(message)
    assert DEFANGED in body and f"Review it (approve or reject): {review}" in body
    for said in (message["text"], body):
        assert re.findall(r"\w+://\S+", said) == [review]
        assert ".example" not in said.replace(PUBLIC, "") and "。" not in said


def test_a_receiver_failing_twice_gets_three_attempts_with_growing_backoff(alice, receiver, eager_celery):
    hook = receiver(503, 500, 200)
    retried, delivered = counted("webhook", "retried"), counted("webhook", "delivered")
    with webhook_settings(hook.url, YUZU_APPROVAL_NOTIFY_BACKOFF=0.4, YUZU_APPROVAL_NOTIFY_ATTEMPTS=5):
        tid, _ = mint_ticket(alice)
        wait_until(lambda: notify_audits(tid), timeout=30, what="the delivery to be audited")

    assert len(hook.requests) == 3
    gaps = [b["at"] - a["at"] for a, b in itertools.pairwise(hook.requests)]
    assert gaps[0] >= 0.4 and gaps[1] >= 0.8, gaps  # BACKOFF, then 2 × BACKOFF
    assert len({r["headers"]["x-yuzu-delivery"] for r in hook.requests}) == 1  # one delivery, three attempts
    assert all(verify(r) for r in hook.requests)  # every attempt is signed afresh
    assert [(a.result, a.detail) for a in notify_audits(tid)] == [("success", "channel=webhook attempts=3")]
    assert (counted("webhook", "retried"), counted("webhook", "delivered")) == (retried + 2, delivered + 1)


def test_a_receiver_that_always_fails_stops_at_the_bound_logged_and_counted(alice, receiver, eager_celery, caplog):
    hook = receiver(500)
    failed = counted("webhook", "failed")
    caplog.set_level(logging.INFO, logger="yuzu.approvals.notify")
    with webhook_settings(hook.url, YUZU_APPROVAL_NOTIFY_BACKOFF=0.1, YUZU_APPROVAL_NOTIFY_ATTEMPTS=3):
        tid, elapsed = mint_ticket(alice)
        wait_until(lambda: notify_audits(tid), timeout=30, what="the failure to be audited")
        time.sleep(1.0)  # long past the next backoff (0.4 s): no fourth attempt comes
    assert elapsed < 5, elapsed

    assert len(hook.requests) == 3
    [row] = notify_audits(tid)
    assert row.result == "failure" and row.principal == "system"
    host = hook.url.removesuffix(SECRET_PATH)
    assert row.detail == f"channel=webhook attempts=3 error={host} answered HTTP 500"
    assert counted("webhook", "failed") == failed + 1
    logs = "\n".join(r.getMessage() for r in caplog.records)
    assert f"approval {tid}: webhook notification failed after 3 attempt(s): {host} answered HTTP 500" in logs
    assert logs.count("retrying in") == 2
    assert SECRET not in logs and SECRET_PATH not in logs  # neither the secret nor the URL's secret path


def test_a_client_error_is_not_retried(alice, receiver, eager_celery):
    hook = receiver(404)
    with webhook_settings(hook.url):
        tid, _ = mint_ticket(alice)
        wait_until(lambda: notify_audits(tid), timeout=20, what="the failure to be audited")
    assert len(hook.requests) == 1
    assert notify_audits(tid)[0].detail.endswith("answered HTTP 404")


def test_a_hanging_or_dead_webhook_never_slows_or_fails_the_minting_call(alice, receiver, eager_celery):
    hung = receiver(200, hold=True)  # accepts the connection, never answers until released
    with webhook_settings(hung.url, YUZU_APPROVAL_WEBHOOK_TIMEOUT=2, YUZU_APPROVAL_NOTIFY_ATTEMPTS=1):
        tid, elapsed = mint_ticket(alice)
        assert elapsed < 1.5, elapsed  # the webhook's 2 s timeout is not spent in the call
        wait_until(lambda: notify_audits(tid), timeout=20, what="the timeout to be audited")
    assert len(hung.requests) == 1
    assert notify_audits(tid)[0].result == "failure" and "timed out" in notify_audits(tid)[0].detail

    dead = Receiver()
    dead.stop()  # nothing listens on this port any more
    with webhook_settings(dead.url, YUZU_APPROVAL_NOTIFY_ATTEMPTS=1):
        err = alice.call("delete_tag", {**ARGS, "key": "other"}).json()["error"]
        assert err["code"] == -32006, err
        tid2 = err["data"]["approval_id"]
        wait_until(lambda: notify_audits(tid2), timeout=20, what="the refused connection to be audited")
    assert "ConnectionRefusedError" in notify_audits(tid2)[0].detail
    assert Approval.objects.get(pk=tid2).status == "pending"


def test_nothing_is_sent_for_a_rolled_back_ticket_or_a_deduplicated_call(alice, receiver, eager_celery):
    hook = receiver(200)
    with webhook_settings(hook.url):
        with pytest.raises(RuntimeError), transaction.atomic():
            Approval.objects.create(definition_id="mcp.delete_tag", submitted_by="alice", scope_expression="{}")
            raise RuntimeError("roll back")
        tid, _ = mint_ticket(alice)
        assert mint_ticket(alice)[0] == tid  # the same pending ticket again: no second notification
        wait_until(lambda: notify_audits(tid), timeout=20, what="the delivery")
        time.sleep(0.5)
    assert [json.loads(r["body"])["approval_id"] for r in hook.requests] == [tid]


def test_without_configuration_nothing_is_scheduled(alice, receiver, eager_celery, monkeypatch):
    from approvals import notify

    calls = []
    monkeypatch.setattr(notify, "notify_new_ticket", lambda t: calls.append(t))
    with override_settings(YUZU_APPROVAL_WEBHOOK_URL="", YUZU_APPROVAL_EMAIL=False):
        mint_ticket(alice)
    assert calls == []


def test_a_webhook_url_without_a_secret_refuses_to_start():
    def start(**env):
        env = server_env(**env)
        return subprocess.run([sys.executable, "-c", "import yuzu.settings"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)

    r = start(YUZU_APPROVAL_WEBHOOK_URL="https://hooks.example.test/x", YUZU_APPROVAL_WEBHOOK_SECRET="")
    assert r.returncode != 0 and "YUZU_APPROVAL_WEBHOOK_SECRET must be set" in r.stderr
    r = start(YUZU_APPROVAL_WEBHOOK_URL="ftp://hooks.example.test/x", YUZU_APPROVAL_WEBHOOK_SECRET=SECRET)
    assert r.returncode != 0 and "must be an http:// or https:// URL" in r.stderr
    r = start(YUZU_APPROVAL_NOTIFY_ATTEMPTS="0")
    assert r.returncode != 0 and "YUZU_APPROVAL_NOTIFY_ATTEMPTS" in r.stderr
    assert start(YUZU_APPROVAL_WEBHOOK_URL="https://hooks.example.test/x",
                 YUZU_APPROVAL_WEBHOOK_SECRET=SECRET).returncode == 0


# --- email -------------------------------------------------------------------------------------

@pytest.fixture
def people(make_user):
    """Who may approve everywhere (carol, root), and who may not (dave: only on a group; erin: Viewer;
    frank: inactive; gina: no staff flag so no admin login; hank: no address)."""
    group = ManagementGroup.objects.create(name="payments")
    made = {
        "carol": make_user("carol", "Approver"), "root": make_user("root", superuser=True),
        "dave": make_user("dave", "Approver", group=group), "erin": make_user("erin", "Viewer"),
        "frank": make_user("frank", "Approver"), "gina": make_user("gina", "Approver"),
        "hank": make_user("hank", "Approver"),
    }
    User = get_user_model()
    for name, user in made.items():
        User.objects.filter(pk=user.pk).update(email="" if name == "hank" else f"{name}@example.test",
                                               is_staff=name != "gina", is_active=name != "frank")
    return made


def email_settings(**extra):
    return override_settings(YUZU_APPROVAL_EMAIL=True, YUZU_APPROVAL_WEBHOOK_URL="", YUZU_PUBLIC_URL=PUBLIC,
                             EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend",
                             DEFAULT_FROM_EMAIL="yuzu@example.test",
                             **{"YUZU_APPROVAL_EMAIL_TO": [], "YUZU_APPROVAL_NOTIFY_BACKOFF": 0.1, **extra})


def test_approvers_get_an_email_and_nobody_else_does(alice, people, eager_celery):
    before = counted("email", "delivered")
    with email_settings(YUZU_APPROVAL_EMAIL_TO=["change-board@example.test"]):
        tid, _ = mint_ticket(alice)
        wait_until(lambda: len(notify_audits(tid)) == 3, timeout=20, what="three emails")
        time.sleep(0.3)
    assert sorted(m.to[0] for m in mail.outbox) == ["carol@example.test", "change-board@example.test",
                                                    "root@example.test"]
    assert all(len(m.to) == 1 and not m.cc and not m.bcc for m in mail.outbox)  # nobody sees the others
    message = mail.outbox[0]
    assert message.subject == "[yuzu] Approval requested: delete_tag by alice"
    assert message.from_email == "yuzu@example.test"
    assert f"Ticket:     {tid}" in message.body
    assert f"Review it (approve or reject): {PUBLIC}/admin/approvals/approval/{tid}/review/" in message.body
    assert f"Expires:    {Approval.objects.get(pk=tid).expires_at.isoformat()}" in message.body
    assert "scope_expression" not in message.body and '"agent_id"' not in message.body  # no arguments
    assert counted("email", "delivered") == before + 3


def test_the_submitter_is_not_mailed_and_the_approver_list_can_be_replaced(people, eager_celery):
    with email_settings():
        ticket = committed_ticket(submitted_by="carol")  # carol may approve, but not her own ticket
        wait_until(lambda: len(notify_audits(ticket.pk)) == 1, timeout=20, what="one email")
    assert [m.to for m in mail.outbox] == [["root@example.test"]]
    assert PASSWORDISH not in mail.outbox[0].body

    mail.outbox.clear()
    with email_settings(YUZU_APPROVAL_EMAIL_APPROVERS=False, YUZU_APPROVAL_EMAIL_TO=["oncall@example.test"]):
        ticket = committed_ticket()
        wait_until(lambda: len(notify_audits(ticket.pk)) == 1, timeout=20, what="one email")
    assert [m.to for m in mail.outbox] == [["oncall@example.test"]]


def test_a_failing_mail_server_is_retried_then_given_up(people, eager_celery, monkeypatch):
    import smtplib

    from django.core.mail.backends.locmem import EmailBackend

    attempts = []

    def refuse(self, messages):
        attempts.append(messages[0].to[0])
        raise smtplib.SMTPServerDisconnected("connection unexpectedly closed")

    monkeypatch.setattr(EmailBackend, "send_messages", refuse)
    with email_settings(YUZU_APPROVAL_EMAIL_APPROVERS=False, YUZU_APPROVAL_EMAIL_TO=["oncall@example.test"],
                        YUZU_APPROVAL_NOTIFY_ATTEMPTS=2):
        ticket = committed_ticket()
        wait_until(lambda: notify_audits(ticket.pk), timeout=20, what="the failure")
    assert attempts == ["oncall@example.test"] * 2
    assert notify_audits(ticket.pk)[0].detail == ("channel=email attempts=2 error=email to oncall@example.test: "
                                                  "SMTPServerDisconnected: connection unexpectedly closed")


# --- a real Celery worker on Redis -----------------------------------------------------------------

@pytest.mark.live
@pytest.mark.skipif(not settings.REDIS_URL, reason="needs YUZU_REDIS_URL: CI runs it (embedded mode has no worker)")
def test_the_retries_run_in_a_real_celery_worker(alice, receiver, tmp_path):
    from yuzu.celery import app

    assert not app.conf.task_always_eager  # this process only queues; the worker delivers
    hook = receiver(502, 503, 200)
    app.control.purge()
    env = server_env(YUZU_APPROVAL_WEBHOOK_URL=hook.url, YUZU_APPROVAL_WEBHOOK_SECRET=SECRET,
                     YUZU_PUBLIC_URL=PUBLIC, YUZU_APPROVAL_NOTIFY_BACKOFF="0.5", YUZU_APPROVAL_NOTIFY_ATTEMPTS="3")
    log_path = tmp_path / "celery-worker.log"
    with open(log_path, "w") as log:
        worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "yuzu", "worker", "-l", "info",
                                   "--concurrency", "1", "--without-gossip", "--without-mingle",
                                   "-n", f"notify-{time.monotonic_ns()}@%h"], cwd=ROOT, env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with webhook_settings(hook.url):
            tid, elapsed = mint_ticket(alice)
            assert elapsed < 5, elapsed
            wait_until(lambda: notify_audits(tid) or worker.poll() is not None, timeout=90,
                       what="the worker's delivery")
    finally:
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)
    logs = log_path.read_text(errors="replace")
    assert [(a.result, a.detail) for a in notify_audits(tid)] == [("success", "channel=webhook attempts=3")], logs
    assert len(hook.requests) == 3 and all(verify(r) for r in hook.requests)
    gaps = [b["at"] - a["at"] for a, b in itertools.pairwise(hook.requests)]
    assert gaps[0] >= 0.5 and gaps[1] >= 1.0, gaps
    assert f"approval {tid}: webhook notification attempt 1/3 failed" in logs
    assert f"approval {tid}: webhook notification delivered (attempt 3)" in logs
    assert SECRET not in logs and SECRET_PATH not in logs
