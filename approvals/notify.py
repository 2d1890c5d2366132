"""Tell the people who may approve that a ticket is waiting: email through Django's email backend and a
signed JSON webhook (docs/approvals.md#notifications).

A new pending ticket (post_save, created) schedules its notifications for when its transaction commits, so
a rolled-back ticket announces nothing. Delivery runs in Celery tasks (approvals.tasks), retried with
exponential backoff a bounded number of times. Nothing here may fail or slow the call that minted the
ticket: scheduling errors are logged and counted, never raised, and in embedded mode (Celery eager) the
tasks run on a background thread instead of inside the request.

A notification says what is asked in words — tool, submitter, ticket id, the ticket's summary when it has
one, when it expires and where to review it. It never carries the tool's arguments: they may hold secrets. The
summary holds text a submitter or an agent chose (a group's name, a reason, a hostname): its URLs and host names are
defanged (``hxxps[://]evil[.]example``, yuzu.text.defang), since Slack, Teams and mail clients link plain URLs and a
submitter's "verify at https://…" was a clickable phishing link next to ours; the review link is the only link.
"""

import hashlib
import hmac
import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.request
import uuid
from functools import partial
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage
from django.db import connections, transaction
from django.db.models import Q
from django.urls import reverse

from yuzu.metrics import APPROVAL_NOTIFICATIONS
from yuzu.models import RoleAssignment
from yuzu.text import defang, visible

log = logging.getLogger("yuzu.approvals.notify")

EVENT = "approval.requested"
SUMMARY_MAX = 500
BACKOFF_MAX = 1800.0  # under the Redis broker's 1 h visibility timeout, so a waiting retry is not redelivered


class Undeliverable(Exception):
    """One delivery attempt failed. ``transient`` failures are retried; the message never holds the
    webhook's path or secret."""

    def __init__(self, message, transient=True):
        super().__init__(message)
        self.transient = transient


# --- scheduling (in the process that minted the ticket) ----------------------------------------

def on_approval_saved(sender, instance, created, raw=False, **kwargs):
    """post_save receiver on Approval (connected in ApprovalsConfig.ready)."""
    if not created or raw or instance.status != instance.PENDING:
        return
    if not (settings.YUZU_APPROVAL_WEBHOOK_URL or settings.YUZU_APPROVAL_EMAIL):
        return
    transaction.on_commit(partial(notify_new_ticket, instance), robust=True)


def notify_new_ticket(ticket):
    """Queue the webhook and one email per recipient. Never raises: a notification problem must not
    touch the call that minted the ticket."""
    # cycle: approvals.tasks imports this module for the senders it retries
    from .tasks import deliver_webhook, send_email

    try:
        message = ticket_message(ticket)
        if settings.YUZU_APPROVAL_WEBHOOK_URL:
            enqueue(deliver_webhook, "webhook", message, uuid.uuid4().hex)
        if settings.YUZU_APPROVAL_EMAIL:
            for address in email_recipients(ticket):
                enqueue(send_email, "email", message, address)
    except Exception:
        log.exception("approval %s: could not schedule its notifications", ticket.pk)
        APPROVAL_NOTIFICATIONS.labels("scheduling", "failed").inc()


def enqueue(task, channel, *args):
    if task.app.conf.task_always_eager:
        # Eager Celery would run the task, its retries and their backoff inside this request, and
        # CELERY_TASK_EAGER_PROPAGATES would raise its failures into it: run it on a thread of its own.
        threading.Thread(target=_run_eagerly, args=(task, args), daemon=True,
                         name=f"yuzu-notify-{channel}").start()
        return
    try:
        # A bounded publish retry: a broker outage costs this call at most about a second.
        task.apply_async(args, retry=True, retry_policy={"max_retries": 2, "interval_start": 0.1,
                                                         "interval_step": 0.3, "interval_max": 0.5})
    except Exception as exc:
        log.error("approval %s: could not queue the %s notification: %s", args[0].get("approval_id"), channel,
                  type(exc).__name__)
        APPROVAL_NOTIFICATIONS.labels(channel, "failed").inc()


def _run_eagerly(task, args):
    try:
        task.apply(args, throw=False)
    except Exception:
        log.exception("%s notification failed", task.name)
    finally:
        connections.close_all()


# --- what is said --------------------------------------------------------------------------------

def ticket_message(ticket):
    """The notification's content, a JSON-able dict: what is asked, by whom, until when, where to review.
    Never the arguments (``scope_expression``). The summary is one line, defanged, hidden characters named."""
    summary = visible(defang(" ".join(str(getattr(ticket, "summary", "") or "").split())))[:SUMMARY_MAX]
    tool = ticket.definition_id.removeprefix("mcp.")
    review_url = settings.YUZU_PUBLIC_URL + reverse("admin:approvals_approval_review", args=[ticket.pk])
    expires = ticket.expires_at
    text = (f"{ticket.submitted_by} asks to run {tool}" + (f": {chat_text(summary)}" if summary else "")
            + f". Approval ticket {ticket.pk}, expires {expires:%Y-%m-%d %H:%M} UTC. Review it: {review_url}")
    return {
        "event": EVENT, "approval_id": ticket.pk, "tool": tool, "definition_id": ticket.definition_id,
        "submitted_by": ticket.submitted_by, "submitted_at": ticket.submitted_at.isoformat(),
        "expires_at": expires.isoformat(), "origin": ticket.origin, "summary": summary,
        "review_url": review_url, "text": text,
    }


def chat_text(text):
    """Submitter-controlled text for ``text``, which a Slack incoming webhook posts as it is: its three control
    characters escaped as Slack documents, so ``<https://…|label>`` is no link of the submitter's under a label of
    their choosing and ``<!channel>`` pages nobody (the review link, ours, stays a link)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def email_recipients(ticket):
    """Active staff users with an address who may approve everywhere (superusers and holders of a global
    role granting Approval:Approve) — not the submitter, who cannot review their own ticket — plus the
    configured extra addresses."""
    addresses = set(settings.YUZU_APPROVAL_EMAIL_TO)
    if settings.YUZU_APPROVAL_EMAIL_APPROVERS:
        User = get_user_model()
        global_approvers = RoleAssignment.objects.filter(
            group__isnull=True, role__permissions__securable="Approval", role__permissions__operation="Approve",
        ).values("user_id")
        users = (User.objects.filter(is_active=True, is_staff=True)
                 .filter(Q(is_superuser=True) | Q(pk__in=global_approvers))
                 .exclude(**{User.USERNAME_FIELD: ticket.submitted_by}))
        addresses |= {u.email for u in users if u.email}
    return sorted(addresses)


def email_content(message):
    subject = f"[yuzu] Approval requested: {message['tool']} by {message['submitted_by']}"
    lines = [f"{message['submitted_by']} asks to run {message['tool']}.", ""]
    if message["summary"]:
        lines += [message["summary"], ""]
    lines += [f"Ticket:     {message['approval_id']}",
              f"Submitted:  {message['submitted_at']}",
              f"Expires:    {message['expires_at']}",
              "", f"Review it (approve or reject): {message['review_url']}", "",
              "You receive this because you may approve yuzu tickets."]
    return subject, "\n".join(lines) + "\n"


# --- delivery (in the Celery task) -------------------------------------------------------------

def backoff(attempt):
    """Seconds to wait after failed attempt number ``attempt`` (1-based): BACKOFF × 2^(attempt-1), ≤ 30 min."""
    return min(settings.YUZU_APPROVAL_NOTIFY_BACKOFF * 2 ** (attempt - 1), BACKOFF_MAX)


def sign(secret, timestamp, body):
    """HMAC-SHA256 over "<timestamp>." + the raw body, hex: the X-Yuzu-Signature header is "sha256=" + this."""
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a 3xx is answered as an HTTPError: signed bodies are not re-sent elsewhere


_opener = urllib.request.build_opener(_NoRedirects)


def webhook_host():
    """The webhook URL as logs may show it: scheme and host only (Slack-style URLs hold a secret path)."""
    parts = urlsplit(settings.YUZU_APPROVAL_WEBHOOK_URL)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def post_webhook(message, delivery_id):
    """One signed POST. Returns the HTTP status on 2xx; raises Undeliverable otherwise (transient for
    network errors, timeouts, 408, 429 and 5xx)."""
    body = json.dumps(message, separators=(",", ":"), sort_keys=True).encode()
    timestamp = str(int(time.time()))
    request = urllib.request.Request(settings.YUZU_APPROVAL_WEBHOOK_URL, data=body, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": "yuzu-approvals/1", "X-Yuzu-Event": EVENT,
        "X-Yuzu-Delivery": delivery_id, "X-Yuzu-Timestamp": timestamp,
        "X-Yuzu-Signature": "sha256=" + sign(settings.YUZU_APPROVAL_WEBHOOK_SECRET, timestamp, body),
    })
    where = webhook_host()
    try:
        with _opener.open(request, timeout=settings.YUZU_APPROVAL_WEBHOOK_TIMEOUT) as response:
            response.read(65536)
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
        exc.close()
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise Undeliverable(f"{where}: {type(reason).__name__}: {str(reason)[:200]}") from None
    if 200 <= status < 300:
        return status
    raise Undeliverable(f"{where} answered HTTP {status}", transient=status in (408, 429) or status >= 500)


def send_email(message, address):
    subject, body = email_content(message)
    try:
        EmailMessage(subject, body, settings.DEFAULT_FROM_EMAIL, [address]).send()
    except (OSError, http.client.HTTPException) as exc:  # smtplib's errors are OSErrors
        raise Undeliverable(f"email to {address}: {type(exc).__name__}: {str(exc)[:200]}") from None
    except ValueError as exc:  # a bad header or address: retrying will not help
        raise Undeliverable(f"email to {address}: {exc}"[:300], transient=False) from None
