"""Account lockout after repeated failed logins, and the unlock capability."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
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
    """ModelBackend that refuses a locked account."""

    def user_can_authenticate(self, user: User | AnonymousUser | None) -> bool:
        if not super().user_can_authenticate(user):
            return False
        lock = getattr(user, "lockout", None)
        return lock is None or not lock.is_locked()


def record_failure(username: str) -> None:
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        return
    with transaction.atomic():
        lock, _ = AccountLockout.objects.select_for_update().get_or_create(user=user)
        lock.failed_attempts += 1
        if lock.failed_attempts >= MAX_FAILURES:
            lock.locked_until = timezone.now() + LOCK_FOR
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
    was_locked = AccountLockout.objects.filter(user=user, locked_until__gt=timezone.now()).exists()
    AccountLockout.objects.filter(user=user).update(failed_attempts=0, locked_until=None)
    audit(principal, "account.unlock", "success", target_type="User", target_id=username,
          detail=f"was_locked={was_locked}", correlation_id=cid)
    return {"username": username, "unlocked": True, "was_locked": was_locked}


