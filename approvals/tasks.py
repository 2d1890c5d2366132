"""Celery tasks delivering approval notifications (approvals.notify). An attempt that fails transiently is
retried after BACKOFF × 2^(n-1) seconds — by the Celery worker (a task retry), or in embedded mode on the
background thread running the eager task — up to YUZU_APPROVAL_NOTIFY_ATTEMPTS attempts in all;
the final outcome is counted (yuzu_approval_notifications_total) and audited (approval.notify).

Redelivery after a worker dies (acks_late) may repeat a webhook: receivers deduplicate on X-Yuzu-Delivery."""

import logging
import time

from celery import shared_task
from django.conf import settings

from yuzu.audit import audit
from yuzu.metrics import APPROVAL_NOTIFICATIONS

from . import notify

log = logging.getLogger("yuzu.approvals.notify")


@shared_task(bind=True, acks_late=True, max_retries=None)
def deliver_webhook(self, message, delivery_id):
    return _attempt(self, "webhook", message, lambda: notify.post_webhook(message, delivery_id))


@shared_task(bind=True, acks_late=True, max_retries=None)
def send_email(self, message, address):
    return _attempt(self, "email", message, lambda: notify.send_email(message, address))


def _attempt(task, channel, message, send):
    """Deliver, or schedule the next attempt (a Celery retry) or record that we gave up. Returns True once
    delivered. Eager Celery (embedded mode) retries at once and raises on the second retry, so there the
    attempts loop here, sleeping the backoff on the background thread notify.enqueue started."""
    approval_id, attempt = message["approval_id"], task.request.retries + 1
    limit = settings.YUZU_APPROVAL_NOTIFY_ATTEMPTS
    while True:
        try:
            send()
            break
        except notify.Undeliverable as exc:
            if not (exc.transient and attempt < limit):
                _gave_up(channel, approval_id, attempt, str(exc))
                return False
            delay = notify.backoff(attempt)
            APPROVAL_NOTIFICATIONS.labels(channel, "retried").inc()
            log.warning("approval %s: %s notification attempt %d/%d failed (%s); retrying in %.1f s",
                        approval_id, channel, attempt, limit, exc, delay)
            if not task.request.is_eager:
                raise task.retry(countdown=delay) from None
            time.sleep(delay)
            attempt += 1
        except Exception as exc:  # a bug, not the receiver: no retry, but never an unlogged loss
            log.exception("approval %s: %s notification failed", approval_id, channel)
            _gave_up(channel, approval_id, attempt, type(exc).__name__)
            return False
    APPROVAL_NOTIFICATIONS.labels(channel, "delivered").inc()
    log.info("approval %s: %s notification delivered (attempt %d)", approval_id, channel, attempt)
    audit("system", "approval.notify", "success", target_type="Approval", target_id=approval_id,
          detail=f"channel={channel} attempts={attempt}")
    return True


def _gave_up(channel, approval_id, attempt, reason):
    APPROVAL_NOTIFICATIONS.labels(channel, "failed").inc()
    log.error("approval %s: %s notification failed after %d attempt(s): %s", approval_id, channel, attempt, reason)
    audit("system", "approval.notify", "failure", target_type="Approval", target_id=approval_id,
          detail=f"channel={channel} attempts={attempt} error={reason}")
