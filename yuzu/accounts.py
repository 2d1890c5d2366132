"""Account lockout after repeated failed logins (or set by an administrator), and the unlock capability."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from .audit import audit
from .errors import NotFound
from .jsondata import JsonObject
from .models import AccountLockout
from .plans import Plan

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

    from .rbac import Principal

MAX_FAILURES = 5
LOCK_FOR = timedelta(minutes=15)


class LockingBackend(ModelBackend):
    """ModelBackend that refuses a new sign-in to a locked account. A live session (``get_user``, every request) ends
    only on an administrator's lock: failed sign-ins — anyone's to make for a known username — must not sign an
    administrator out, nor stop their approvals, again and again."""

    def user_can_authenticate(self, user: User | AnonymousUser | None) -> bool:
        if not super().user_can_authenticate(user):
            return False
        lock = getattr(user, "lockout", None)
        return lock is None or not lock.is_locked()

    def get_user(self, user_id: int) -> User | None:
        user: User | None = get_user_model()._default_manager.select_related("lockout").filter(pk=user_id).first()
        if user is None or not super().user_can_authenticate(user):  # Django's check: an inactive user is signed out
            return None
        lock = getattr(user, "lockout", None)
        return None if lock is not None and lock.ends_sessions() else user


def record_failure(username: str) -> None:
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        return
    with transaction.atomic():
        lock, _ = AccountLockout.objects.select_for_update().get_or_create(user=user)
        lock.failed_attempts += 1
        now = timezone.now()
        if lock.failed_attempts >= MAX_FAILURES:
            if not lock.is_locked(now):
                lock.manual = False  # an administrator's lock that ran out: this one is the failures' own
            lock.locked_until = max(lock.locked_until or now, now + LOCK_FOR)  # never shortening a longer one
        lock.save()
    if lock.locked_until:
        audit(username, "account.locked", "denied", target_type="User", target_id=username,
              detail=f"failed_attempts={lock.failed_attempts}")


def plan_unlock_account(principal: Principal, username: str, pinned: JsonObject | None = None) -> Plan[User]:
    user = get_user_model().objects.filter(username=username).first()
    if user is None or (pinned is not None and (pinned or {}).get("user") not in (None, user.pk)):
        raise NotFound(f"user not found: {username}")
    locked = AccountLockout.objects.filter(user=user, locked_until__gt=timezone.now()).values_list(
        "locked_until", flat=True).first()
    state = f"locked until {locked:%Y-%m-%d %H:%M} UTC" if locked else "not locked now"
    return Plan(summary=f"Unlock the account of {username} ({state}) and reset its failed-login count",
                value=user, pins={"user": user.pk}, risk="write")


def unlock_account(principal: Principal, username: str = "", *, cid: str = "",
                   plan: Plan[User] | None = None) -> JsonObject:
    user = (plan or plan_unlock_account(principal, username)).value
    username = user.get_username()
    with transaction.atomic():  # the row locked, as record_failure locks it: a failure counted meanwhile waits
        lock = AccountLockout.objects.select_for_update().filter(user=user).first()
        was_locked = lock is not None and lock.is_locked()
        if lock is not None:
            lock.failed_attempts, lock.locked_until, lock.manual = 0, None, False
            lock.save(update_fields=["failed_attempts", "locked_until", "manual"])
    audit(principal, "account.unlock", "success", target_type="User", target_id=username,
          detail=f"was_locked={was_locked}", correlation_id=cid)
    return {"username": username, "unlocked": True, "was_locked": was_locked}


def lock_account(principal: Principal, username: str, until: datetime, *, cid: str = "") -> JsonObject:
    """An administrator's lock (the admin's lockout page): new sign-ins are refused and live sessions end until
    ``until``. The row is locked as record_failure locks it, so a failed sign-in counted meanwhile is not lost."""
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"user not found: {username}")
    if until <= timezone.now():
        raise ValidationError({"locked_until": "a lock ends in the future; to unlock, leave it empty"})
    with transaction.atomic():
        lock, _ = AccountLockout.objects.select_for_update().get_or_create(user=user)
        lock.locked_until, lock.manual = until, True
        lock.save(update_fields=["locked_until", "manual"])
    audit(principal, "account.lock", "success", target_type="User", target_id=username,
          detail=f"until={until.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}", correlation_id=cid)
    return {"username": username, "locked": True, "locked_until": until.astimezone(UTC).isoformat()}
