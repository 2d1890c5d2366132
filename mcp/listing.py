"""tools/list fitted to the caller, and notifications/tools/list_changed when a role change alters it.

A caller is listed the tools it may call somewhere: the ones no standing refusal stops (read-only mode,
service scope, tier: mcp.pipeline.standing_refusal) and — for tools under RBAC — that its owner's roles
grant on at least one scope (yuzu.rbac.has_any). ``_meta["yuzu/all"]: true`` on tools/list shows the
whole catalogue instead, each tool the caller may not call marked so. A tool that needs a human approval
on the caller's tier is marked in its annotations and description.

A session that listed the fitted catalogue remembers a fingerprint of it; when a role change (or a
user's superuser/active flag) alters what that session would be listed, the session's GET stream gets
``notifications/tools/list_changed``. A 2026-07-28 ``subscriptions/listen`` stream that asked for
``toolsListChanged`` keeps its own fingerprint and is woken the same way (its user's listen group).
"""

import hashlib
import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.contrib.auth import get_user_model
from django.db import models, transaction
from django.db.models.signals import post_delete, post_save

from yuzu import rbac
from yuzu.errors import YuzuError
from yuzu.jsondata import JsonObject
from yuzu.models import RoleAssignment, RolePermission
from yuzu.policy import requires_approval

from .pipeline import standing_refusal
from .registry import Catalogue, Tool, catalogue
from .streaming.ring import ring_key, rings
from .streaming.sessions import store
from .streaming.wake import wake, wake_listeners

if TYPE_CHECKING:
    from yuzu.models import RoleAssignment, RolePermission

log = logging.getLogger("yuzu.mcp")
ALL_TOOLS = "yuzu/all"  # tools/list params._meta switch: the whole catalogue, not only what the caller may call
APPROVAL_MARK = "yuzu/approvalRequired"
CALLABLE_MARK = "yuzu/callable"
LIST_CHANGED = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}


def refusal_for(principal: rbac.Principal, tool: Tool) -> YuzuError | None:
    """Why this caller may call the tool nowhere, or None when some call of it may pass."""
    standing = standing_refusal(principal, tool)
    if standing is not None:
        return standing[1]
    if tool.rbac and not rbac.has_any(principal, tool.securable, tool.operation):
        return rbac.denial(principal, tool.securable, tool.operation)
    return None


def callable_by(principal: rbac.Principal, tool: Tool) -> bool:
    """``refusal_for(…) is None``, without RBAC's explanation (it costs queries)."""
    return standing_refusal(principal, tool) is None and (
        not tool.rbac or rbac.has_any(principal, tool.securable, tool.operation))


def tool_item(tool: Tool, principal: rbac.Principal, refusal: YuzuError | None = None) -> JsonObject:
    """The tools/list item of ``tool`` for this caller: the catalogue's listing plus the caller's marks."""
    item = tool.listing()
    marks: dict[str, bool] = {}
    notes: list[str] = []
    if refusal is not None:
        marks[CALLABLE_MARK] = False
        notes.append(f"Not callable with your token: {refusal.message}.")
    elif requires_approval(principal.tier, tool.securable, tool.operation):
        marks[APPROVAL_MARK] = True
        notes.append(f"Needs a human approval on your tier ({principal.tier}): the first call answers -32006 with "
                     "an approval_id.")
    if marks:  # annotations for the spec's hint readers; _meta too, as SDKs drop annotation keys they do not know
        item["annotations"].update(marks)
        item["_meta"] = dict(marks)
        item["description"] = " ".join(notes + [item["description"]])
    return item


def tools_for(principal: rbac.Principal, cat: Catalogue, everything: bool = False) -> list[JsonObject]:
    """The caller's tools/list items, by name (a stable order across pages and calls); with ``everything``, the
    tools it may not call too, each marked with why."""
    items = []
    for tool in sorted(cat.tools.values(), key=lambda t: t.name):
        if everything:
            items.append(tool_item(tool, principal, refusal_for(principal, tool)))
        elif callable_by(principal, tool):
            items.append(tool_item(tool, principal))
    return items


def fingerprint(cat_name: str, items: list[JsonObject]) -> str:
    names = "\n".join(item["name"] for item in items)
    return f"{cat_name}:{hashlib.sha256(names.encode()).hexdigest()[:16]}"


def note_listed(principal: rbac.Principal, session_id: str, cat_name: str, items: list[JsonObject]) -> None:
    """Remember what this session was listed, so a role change that alters it can tell the session."""
    store().note_listing(session_id, principal.key, fingerprint(cat_name, items))


def refresh_user(user_id: int) -> int:
    """Re-fit the catalogue of every listed session of this user's principals; tell each whose list changed.
    Returns how many sessions were told."""
    told = 0
    for session in store().listed(rbac.Principal.key_prefix(user_id)):
        principal = rbac.Principal.from_key(session.principal)
        cat_name = session.listing.partition(":")[0]
        if principal is None or not cat_name:
            continue  # a revoked token or an inactive user: its streams close on their own
        now = fingerprint(cat_name, tools_for(principal, catalogue(cat_name)))
        if now == session.listing:
            continue
        store().note_listing(session.id, session.principal, now)
        key = ring_key(session.principal, session.id)
        rings().append(key, LIST_CHANGED)
        wake(key)
        told += 1
    return told


# --- role changes → per-principal wakes, once the change is committed ----------------------------

_pending = threading.local()


def rbac_changed(user_ids: Iterable[int | None]) -> None:
    """Called for every change that may alter what users may do; the sessions are re-fitted after commit."""
    ids = getattr(_pending, "ids", None)
    if ids is None:
        ids = _pending.ids = set()
    ids.update(i for i in user_ids if i is not None)
    transaction.on_commit(_flush)


def _flush() -> None:
    ids = getattr(_pending, "ids", None) or set()
    _pending.ids = set()
    for user_id in sorted(ids):
        try:
            refresh_user(user_id)
            wake_listeners(user_id)  # 2026-07-28 listen streams re-fit their own list (mcp.streaming.modern)
        except Exception:  # a notification must never fail the change that caused it
            log.exception("tools/list_changed for user %s failed", user_id)


def on_role_assignment(sender: type[models.Model], instance: "RoleAssignment", **kwargs: object) -> None:
    rbac_changed([instance.user_id])


def on_role_permission(sender: type[models.Model], instance: "RolePermission", **kwargs: object) -> None:
    rbac_changed(RoleAssignment.objects.filter(role_id=instance.role_id).values_list("user_id", flat=True))


def on_user(sender: type[models.Model], instance: models.Model, update_fields: Iterable[str] | None = None,
            **kwargs: object) -> None:
    if update_fields is None or {"is_superuser", "is_active"} & set(update_fields):
        rbac_changed([instance.pk])


def connect_signals() -> None:
    for label, signal in (("save", post_save), ("delete", post_delete)):
        signal.connect(on_role_assignment, sender=RoleAssignment, dispatch_uid=f"mcp.listing.assignment.{label}")
        signal.connect(on_role_permission, sender=RolePermission, dispatch_uid=f"mcp.listing.permission.{label}")
    post_save.connect(on_user, sender=get_user_model(), dispatch_uid="mcp.listing.user")
