"""The bridge's policy layer: identity, the SubscriptionGuard, spawn/stop, the rendezvous bookkeeping
and the views. Shared by the MCP tools (bridge/mcp_tools.py), the REST face (bridge/api.py) and the
StatusPoller/Injector (bridge/poller.py). All functions here are synchronous (Django ORM, tmux);
the blocking waits live in bridge/rendezvous.py.

Outcome delivery rule (never lose a reply): an outcome is written to its Turn row first. If the
turn has a live waiter (``waiter_until`` in the future and no outcome pending yet) it becomes the
turn's ``pending`` outcome, which the waiter takes; otherwise it becomes an InboxItem for the
primary (bridge_poll, at-least-once until bridge_ack). Waiters are then woken through the channel
layer; a lost wake only delays the waiter until its next re-read of the row.
"""

import logging
import os
import re
import sys
from dataclasses import dataclass
from datetime import timedelta

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from yuzu.audit import audit
from yuzu.errors import YuzuError
from yuzu.models import ApiToken

from . import conf
from .models import MAX_CONTENT_BYTES, InboxItem, Member, Message, Profile, Turn
from .status import AgentStatus, classify, matching_rule, status_from_hook, status_from_title
from .terminal import PaneNotFound, TerminalError, TmuxBackend, unpasteable

log = logging.getLogger("yuzu.bridge")

PRIMARY, WORKER = "primary", "worker"
#: environment variables a worker may inherit from the bridge process; nothing else ever is.
INHERITED_ENV = ("PATH", "HOME", "LANG")
BRIDGE_ENV = ("YUZU_BRIDGE_URL", "YUZU_BRIDGE_TOKEN", "YUZU_BRIDGE_SESSION_ID", "YUZU_BRIDGE_EVENTS_URL")
DEFAULT_PROFILE_NAME = "claude-worker"


# -- errors ------------------------------------------------------------------------------------


class BridgeFailure(Exception):
    """A business failure both faces render: MCP → ToolFailure (isError, {error:{code, message,
    retryable}}); REST → the envelope with ``status`` and ``reason: code``."""

    STATUS = {"worker_gone": 410, "subscription_boundary": 403, "unknown_worker": 404, "no_worker": 404,
              "ambiguous_worker": 409, "wrong_role": 403, "not_a_worker": 403, "unknown_turn": 404,
              "no_question": 409, "unknown_profile": 404, "spawn_failed": 502, "delivery_failed": 502,
              "content_too_large": 413}

    def __init__(self, code, message, *, retryable=False, status=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable
        self.status = status or self.STATUS.get(code, 409)

    def error(self):
        return {"code": self.code, "message": self.message, "retryable": self.retryable}

    def as_tool_failure(self):
        from mcp.registry import ToolFailure

        return ToolFailure(self.message, {"code": self.code, "retryable": self.retryable})

    def as_yuzu_error(self):
        return YuzuError(self.message, status=self.status, extra={"reason": self.code, "retryable": self.retryable},
                         audit_result="denied" if self.status == 403 else "failure")


def error_outcome(code, message, turn=None, retryable=False):
    out = {"outcome": "error", "error": {"code": code, "message": message, "retryable": retryable}}
    if turn is not None:
        out["turnId"] = turn.turn_id
    return out


# -- the terminal backend ----------------------------------------------------------------------

_backends = {}


def backend(socket_name=None):
    name = socket_name or conf.socket_name()
    b = _backends.get(name)
    if b is None:
        b = _backends[name] = TmuxBackend(name)
    return b


# -- identity ----------------------------------------------------------------------------------


@dataclass
class Caller:
    """Who is calling, decided from the connection only: a worker's token (audience "bridge", linked
    from a Member) makes the caller that worker; anyone else authenticated is a primary."""

    principal: object
    role: str
    member: Member | None = None

    @property
    def world_key(self):
        """The primary whose world this caller sees (a worker sees its own primary's)."""
        return self.member.owner_key if self.member is not None else self.principal.key

    @property
    def inbox_key(self):
        return self.principal.key

    @property
    def name(self):
        return self.member.name if self.member is not None else self.principal.name


def identify(principal):
    token = getattr(principal, "token", None)
    if token is not None and token.audience == ApiToken.AUDIENCE_BRIDGE:
        member = Member.objects.select_related("profile").filter(token_id=token.pk).first()
        if member is None:
            raise BridgeFailure("not_a_worker", "this bridge token belongs to no worker")
        return Caller(principal, WORKER, member)
    return Caller(principal, PRIMARY)


def require(caller, role, tool):
    if caller.role != role:
        who = "the primary" if role == PRIMARY else "a worker"
        raise BridgeFailure("wrong_role", f"{tool} is for {who}; this connection is a {caller.role}")


# -- views -------------------------------------------------------------------------------------


def _iso(dt):
    return dt.isoformat() if dt else None


def worker_view(m):
    return {"sessionId": m.session_id, "name": m.name, "terminalId": m.terminal_id, "paneId": m.pane_id,
            "profile": m.profile_name, "status": m.status, "agent_status": m.status,
            "statusSince": _iso(m.status_since), "live": m.live}


def status_view(m, now=None):
    now = now or timezone.now()
    view = worker_view(m)
    turns = Turn.objects.filter(member=m)
    view.update({
        "queueDepth": Message.objects.filter(member=m, state__in=[Message.QUEUED, Message.DELIVERED]).count(),
        "rendezvousOpen": turns.filter(Q(waiter_until__gt=now) | Q(state=Turn.QUESTION)).exists(),
        "currentTurnId": m.current_turn.turn_id if m.current_turn_id and m.current_turn.active else None,
        "openTurns": turns.filter(state__in=Turn.ACTIVE).count(),
        "statusSource": m.status_source or None,
    })
    if not m.live:
        view["stoppedAt"] = _iso(m.stopped_at)
        view["stopReason"] = m.stop_reason
    return view


def pending_count(key):
    return InboxItem.objects.filter(recipient_key=key, acked_at__isnull=True).count()


# -- profiles and the SubscriptionGuard ------------------------------------------------------------


def _placeholders(profile):
    return {"{python}": sys.executable, "{repo}": conf.repo_root(), "{addendum}": profile.system_prompt_addendum}


def substitute(value, profile):
    """Replace the exact placeholders {python} {repo} {addendum} (nothing else: JSON braces in an
    argument stay as they are)."""
    if isinstance(value, str):
        for k, v in _placeholders(profile).items():
            value = value.replace(k, v)
        return value
    if isinstance(value, list):
        return [substitute(v, profile) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, profile) for k, v in value.items()}
    return value


class SubscriptionGuard:
    """Keeps workers off the primary's subscription and away from the primary's pane.

    * A profile whose env lacks ANTHROPIC_BASE_URL would start a worker on the subscription the
      machine is logged in with (the primary's): refused, unless the profile is a stand-in that
      declares itself exempt (``requires_api_base_url=False``; it calls no model).
    * A primary that says where its own pane lives (REST header ``X-Bridge-Pane``) must not live on
      the bridge's private tmux server: the bridge closes panes and may shut that server down.
    * No tool takes or returns environment values; a worker's env is built by ``worker_env`` only.
    """

    @staticmethod
    def exempt(profile):
        return not profile.requires_api_base_url and profile.agent_kind == Profile.KIND_STANDIN

    @classmethod
    def spawnable(cls, profile):
        return cls.exempt(profile) or bool(str((profile.env or {}).get("ANTHROPIC_BASE_URL", "")).strip())

    @classmethod
    def check_spawn(cls, profile, primary_pane=None, socket_name=None):
        if not cls.spawnable(profile):
            raise BridgeFailure(
                "subscription_boundary",
                f"profile '{profile.name}' does not set ANTHROPIC_BASE_URL, so a worker started from it would run "
                "on the primary's subscription; an administrator must set it in the profile's env (admin → "
                "Bridge → Profiles) before it can be spawned")
        cls.check_primary_pane(primary_pane, socket_name or conf.socket_name())

    @staticmethod
    def check_primary_pane(primary_pane, socket_name, member=None):
        if not primary_pane:
            return
        sock, sep, pane = primary_pane.rpartition(":")
        on_bridge_server = (sock or socket_name) == socket_name
        if member is not None and on_bridge_server and pane in (member.pane_id, member.terminal_id):
            raise BridgeFailure("subscription_boundary", "that pane is the primary's own pane")
        if member is None and on_bridge_server:
            raise BridgeFailure(
                "subscription_boundary",
                f"the primary's own pane ({primary_pane}) lives on the bridge's tmux server '{socket_name}'; the "
                "bridge will not manage workers beside it. Run the primary in another tmux server")


def default_profile():
    return (Profile.objects.filter(enabled=True, is_default=True).order_by("id").first()
            or Profile.objects.filter(enabled=True, name=DEFAULT_PROFILE_NAME).first())


def resolve_profile(name=None):
    if name:
        profile = Profile.objects.filter(name=name, enabled=True).first()
        if profile is None:
            raise BridgeFailure("unknown_profile", f"no enabled profile '{name}'; bridge_profiles lists them")
        return profile
    profile = default_profile()
    if profile is None:
        raise BridgeFailure("unknown_profile", "no default profile is configured; pass profile")
    return profile


def profile_view(p, default_id=None):
    return {"name": p.name, "description": p.description, "agentKind": p.agent_kind,
            "default": p.pk == default_id, "blockedInjectable": p.blocked_injectable,
            "spawnable": SubscriptionGuard.spawnable(p)}


def list_profiles():
    d = default_profile()
    return [profile_view(p, d.pk if d else None) for p in Profile.objects.filter(enabled=True)]


def _term():
    for base in ("/usr/share/terminfo", "/lib/terminfo", "/etc/terminfo"):
        if os.path.exists(os.path.join(base, "t", "tmux-256color")):
            return "tmux-256color"
    return "screen-256color"


def worker_env(profile, member, raw_token):
    """The worker's whole environment: PATH/HOME/LANG from the bridge (never any ANTHROPIC_* or other
    variable of the bridge process), TERM, the profile's env, then the bridge's own variables."""
    env = {k: os.environ[k] for k in INHERITED_ENV if os.environ.get(k)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    env["TERM"] = _term()
    for k, v in substitute(dict(profile.env or {}), profile).items():
        if k not in BRIDGE_ENV:
            env[k] = str(v)
    env.update({"YUZU_BRIDGE_URL": conf.bridge_url(), "YUZU_BRIDGE_TOKEN": raw_token,
                "YUZU_BRIDGE_SESSION_ID": member.session_id, "YUZU_BRIDGE_EVENTS_URL": conf.events_url(member.session_id)})
    return env


# -- spawn / stop --------------------------------------------------------------------------------


def spawn(caller, profile_name=None, *, primary_pane=None, cid=""):
    """Start a worker pane from a profile. Returns the Member."""
    require(caller, PRIMARY, "bridge_spawn")
    profile = resolve_profile(profile_name)
    sock = conf.socket_name()
    try:
        SubscriptionGuard.check_spawn(profile, primary_pane, sock)
    except BridgeFailure as exc:
        audit(caller.principal, "bridge.spawn", "denied", target_type="BridgeProfile", target_id=profile.name,
              detail=f"reason={exc.code}", correlation_id=cid)
        raise
    now = timezone.now()
    with transaction.atomic():
        member = Member(owner=caller.principal.user, owner_key=caller.world_key, profile=profile,
                        profile_name=profile.name, socket_name=sock)
        member.name = f"{profile.name}-{member.session_id[-4:]}"
        token, raw = ApiToken.mint(caller.principal.user, f"bridge worker {member.session_id}",
                                   audience=ApiToken.AUDIENCE_BRIDGE,
                                   expires_at=now + timedelta(hours=conf.worker_token_hours()), now=now)
        member.token = token
        member.save()
    argv = substitute(list(profile.argv or []), profile)
    cwd = substitute(profile.cwd, profile) or conf.repo_root()
    try:
        info = backend(sock).start(f"bridge-{member.session_id}", argv, worker_env(profile, member, raw), cwd)
    except TerminalError as exc:
        ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
        Member.objects.filter(pk=member.pk).update(stopped_at=timezone.now(), status=AgentStatus.GONE.value,
                                                   stop_reason=f"spawn failed: {exc}"[:256])
        audit(caller.principal, "bridge.spawn", "failure", target_type="BridgeMember", target_id=member.session_id,
              detail=f"profile={profile.name} error={exc}", correlation_id=cid)
        raise BridgeFailure("spawn_failed", f"could not start a pane for profile '{profile.name}': {exc}",
                            retryable=True) from None
    Member.objects.filter(pk=member.pk).update(pane_id=info.pane_id, terminal_id=info.terminal_id)
    member.pane_id, member.terminal_id = info.pane_id, info.terminal_id
    audit(caller.principal, "bridge.spawn", "success", target_type="BridgeMember", target_id=member.session_id,
          detail=f"profile={profile.name} pane={info.pane_id} socket={sock}", correlation_id=cid)
    return member


def _lookup(world_key, ident):
    """A member of this world by session id, pane id or terminal id; live ones first."""
    return (Member.objects.select_related("profile", "current_turn")
            .filter(owner_key=world_key).filter(Q(session_id=ident) | Q(pane_id=ident) | Q(terminal_id=ident))
            .order_by(F("stopped_at").asc(nulls_first=True), "-id").first())


def stop(caller, ident, *, primary_pane=None, cid=""):
    """Tear down a worker. Idempotent: stopping a stopped or unknown worker succeeds (wasRunning false)."""
    require(caller, PRIMARY, "bridge_stop")
    m = _lookup(caller.world_key, ident)
    if m is None:
        return {"paneId": ident, "sessionId": None, "stopped": True, "wasRunning": False}
    SubscriptionGuard.check_primary_pane(primary_pane, m.socket_name, m)
    was = m.live
    terminate(m, "stopped by the primary")
    audit(caller.principal, "bridge.stop", "success", target_type="BridgeMember", target_id=m.session_id,
          detail=f"pane={m.pane_id} was_running={was}", correlation_id=cid)
    return {"paneId": m.pane_id or ident, "sessionId": m.session_id, "stopped": True, "wasRunning": was}


def terminate(member, reason, *, close=True):
    """The worker is gone (stopped, or its pane died): close the pane, revoke its token, fail its
    queue and its open turns (waiters get worker_gone)."""
    if close and member.pane_id:
        try:
            backend(member.socket_name).close(member.pane_id)
        except TerminalError as exc:
            log.warning("closing pane %s of %s: %s", member.pane_id, member.session_id, exc)
    now = timezone.now()
    groups = set()
    with transaction.atomic():
        m = Member.objects.select_for_update().get(pk=member.pk)
        if m.stopped_at is None:
            m.stopped_at, m.stop_reason = now, reason[:256]
            m.status, m.status_since, m.status_source = AgentStatus.GONE.value, now, "bridge"
            m.save(update_fields=["stopped_at", "stop_reason", "status", "status_since", "status_source"])
        if m.token_id:
            ApiToken.objects.filter(pk=m.token_id, revoked_at__isnull=True).update(revoked_at=now)
        Message.objects.filter(member=m, state__in=[Message.QUEUED, Message.DELIVERED]).update(
            state=Message.FAILED, error=f"worker_gone: {reason}"[:512])
        for t in Turn.objects.select_for_update().filter(member=m, state__in=Turn.ACTIVE):
            out = error_outcome("worker_gone", f"worker {m.session_id} is gone ({reason})", t)
            out["sessionId"] = m.session_id
            t.state, t.outcome, t.closed_at, t.updated_at = Turn.GONE, out, now, now
            _emit(t, out, now, groups)
            t.save()
            groups.update({t.group, t.ask_group})
        wake_on_commit(groups)
    member.stopped_at = member.stopped_at or now


# -- rendezvous bookkeeping --------------------------------------------------------------------------


def inbox_group(key):
    return "bridge.inbox." + re.sub(r"[^A-Za-z0-9._-]", "_", key)[:80]


def _kind_of(outcome):
    return {"question": "question", "reply": "reply", "turn_done": "reply", "note": "note",
            "cancelled": "note"}.get(outcome.get("outcome"), "error")


def _to_inbox(key, outcome, groups):
    InboxItem.objects.create(recipient_key=key, kind=_kind_of(outcome), payload=outcome)
    groups.add(inbox_group(key))


def _emit(turn, outcome, now, groups):
    """Hand ``outcome`` to the turn's live waiter, else to the primary's inbox. Returns the mode."""
    groups.add(turn.group)
    if turn.waiter_until is not None and turn.waiter_until > now and turn.pending is None:
        turn.pending = outcome
        return "resolved"
    _to_inbox(turn.owner_key, outcome, groups)
    return "queued"


def wake(*groups):
    layer = get_channel_layer()
    if layer is None:
        return
    for g in groups:
        try:
            async_to_sync(layer.group_send)(g, {"type": "bridge.wake"})
        except Exception:  # a lost wake costs at most one recheck interval
            log.debug("wake %s failed", g, exc_info=True)


def wake_on_commit(groups):
    groups = sorted(set(groups))
    if groups:
        transaction.on_commit(lambda: wake(*groups))


def check_content(content):
    """The one gate for bridge_send / bridge_reply / bridge_ask text, before anything is stored or sent.
    Control characters are refused, not stripped: text that reaches a worker's terminal must be exactly
    what its sender wrote, and an ESC could break out of the bracketed paste (docs/bridge.md)."""
    if len(content.encode("utf-8")) > MAX_CONTENT_BYTES:
        raise YuzuError("content exceeds 64 KiB (65536 bytes of UTF-8)", status=413, rpc_code=-32602,
                        remediation="send less text, or point the worker at a file")
    bad = unpasteable(content)
    if bad is not None:
        raise YuzuError(f"content holds a {bad}; only tab, newline and carriage return are allowed", status=400,
                        rpc_code=-32602, remediation="remove terminal escape sequences and other control characters")


@dataclass
class Prepared:
    turn_pk: int
    turn_id: str
    session_id: str
    wait: bool
    deadline: object = None  # aware datetime


def _choose(members):
    """Among several candidate workers, prefer one with nothing queued and no open turn."""
    for m in members:
        busy = Message.objects.filter(member=m, state__in=[Message.QUEUED, Message.DELIVERED]).exists() or (
            m.current_turn_id is not None and m.current_turn.active)
        if not busy:
            return m
    return members[0]


def resolve_worker(caller, ident=None, *, auto_spawn=False, cid=""):
    """The worker a primary addresses: sessionId / paneId / terminal id / profile name; by default
    the sole worker, else the default profile's worker, else (auto_spawn) a new one."""
    world = caller.world_key
    live = list(Member.objects.select_related("profile", "current_turn").filter(owner_key=world,
                                                                                stopped_at__isnull=True))
    if ident:
        exact = _lookup(world, ident)
        if exact is not None:
            if not exact.live:
                raise BridgeFailure("worker_gone", f"worker {exact.session_id} is gone ({exact.stop_reason})")
            return exact
        by_profile = [m for m in live if m.profile_name == ident]
        if by_profile:
            return _choose(by_profile)
        if Profile.objects.filter(name=ident, enabled=True).exists():
            if auto_spawn:
                return spawn(caller, ident, cid=cid)
            raise BridgeFailure("no_worker", f"no live worker of profile '{ident}'; bridge_spawn starts one")
        raise BridgeFailure("unknown_worker", f"no worker '{ident}' of yours; bridge_list shows your workers")
    if len(live) == 1:
        return live[0]
    default = default_profile()
    if live:
        cands = [m for m in live if default is not None and m.profile_name == default.name]
        if cands:
            return _choose(cands)
        raise BridgeFailure("ambiguous_worker", "several workers and none of the default profile; pass sessionId "
                            "(one of " + ", ".join(m.session_id for m in live[:20]) + ")")
    if auto_spawn:
        if default is None:
            raise BridgeFailure("no_worker", "no worker and no default profile to spawn; call bridge_spawn(profile)")
        return spawn(caller, default.name, cid=cid)
    raise BridgeFailure("no_worker", "you have no live worker; bridge_spawn starts one")


def prepare_send(caller, content, *, session=None, timeout_ms=600000, wait=True, auto_spawn=True, turn_id=None,
                 cid=""):
    """bridge_send before the wait: queue the message on a new turn (or answer a question)."""
    require(caller, PRIMARY, "bridge_send")
    check_content(content)
    now = timezone.now()
    deadline = now + timedelta(milliseconds=timeout_ms)
    groups = set()
    if turn_id:
        with transaction.atomic():
            t = (Turn.objects.select_for_update().select_related("member")
                 .filter(turn_id=turn_id, owner_key=caller.world_key).first())
            if t is None:
                raise BridgeFailure("unknown_turn", f"no turn '{turn_id}' of yours")
            if session and session not in (t.member.session_id, t.member.pane_id, t.member.terminal_id,
                                           t.member.profile_name):
                raise BridgeFailure("unknown_turn", f"turn '{turn_id}' is not with worker '{session}'")
            if t.state == Turn.GONE or not t.member.live:
                raise BridgeFailure("worker_gone", f"worker {t.member.session_id} is gone")
            if t.state != Turn.QUESTION or t.ask_seq <= t.answer_seq:
                raise BridgeFailure("no_question", f"turn '{turn_id}' has no open question (state {t.state}); "
                                                   "send without turnId to start a new turn")
            t.answer, t.answer_seq, t.state, t.updated_at = content, t.ask_seq, Turn.OPEN, now
            t.waiter_until = deadline if wait else None
            t.detached = t.detached or not wait
            t.save()
            groups.add(t.ask_group)
            wake_on_commit(groups)
        audit(caller.principal, "bridge.send", "success", target_type="BridgeMember", target_id=t.member.session_id,
              detail=f"answer turn={t.turn_id} wait={wait}", correlation_id=cid)
        return Prepared(t.pk, t.turn_id, t.member.session_id, wait, deadline)
    member = resolve_worker(caller, session, auto_spawn=auto_spawn, cid=cid)
    with transaction.atomic():
        m = Member.objects.select_for_update().get(pk=member.pk)
        if not m.live:
            raise BridgeFailure("worker_gone", f"worker {m.session_id} is gone ({m.stop_reason})")
        t = Turn.objects.create(member=m, owner_key=caller.world_key, detached=not wait,
                                waiter_until=deadline if wait else None)
        Message.objects.create(member=m, turn=t, content=content)
    audit(caller.principal, "bridge.send", "success", target_type="BridgeMember", target_id=m.session_id,
          detail=f"turn={t.turn_id} wait={wait} bytes={len(content.encode('utf-8'))}", correlation_id=cid)
    return Prepared(t.pk, t.turn_id, m.session_id, wait, deadline)


def take_outcome(turn_pk, final=False):
    """The primary's waiter: take the pending outcome; at the deadline (``final``), give up → timeout."""
    if not final and not Turn.objects.filter(pk=turn_pk, pending__isnull=False).exists():
        return None  # the common re-read: no write lock taken
    with transaction.atomic():
        t = Turn.objects.select_for_update().select_related("member").get(pk=turn_pk)
        if t.pending is not None:
            out = t.pending
            t.pending, t.waiter_until = None, None
            t.save(update_fields=["pending", "waiter_until"])
            return out
        if final:
            t.waiter_until = None
            if t.state == Turn.OPEN:  # the primary stopped waiting; the turn itself goes on
                t.state, t.updated_at = Turn.TIMEOUT, timezone.now()
            t.save(update_fields=["waiter_until", "state", "updated_at"])
            return {"outcome": "timeout", "turnId": t.turn_id, "sessionId": t.member.session_id}
        return None


def release_waiter(turn_pk):
    """The waiter went away early (client disconnected): later outcomes go to the inbox."""
    groups = set()
    with transaction.atomic():
        t = Turn.objects.select_for_update().filter(pk=turn_pk).first()
        if t is None:
            return
        if t.pending is not None:
            _to_inbox(t.owner_key, t.pending, groups)
        t.pending, t.waiter_until = None, None
        t.save(update_fields=["pending", "waiter_until"])
        wake_on_commit(groups)


def reply(caller, content, *, final=True, cid=""):
    require(caller, WORKER, "bridge_reply")
    check_content(content)
    now = timezone.now()
    groups = set()
    with transaction.atomic():
        m = Member.objects.select_for_update().get(pk=caller.member.pk)
        t = Turn.objects.select_for_update().filter(pk=m.current_turn_id).first() if m.current_turn_id else None
        base = {"text": content, "sessionId": m.session_id}
        if not final:
            _to_inbox(m.owner_key, {"outcome": "note", **base, "turnId": t.turn_id if t else None}, groups)
            mode = "queued"
        elif t is not None and t.active:
            out = {"outcome": "reply", **base, "turnId": t.turn_id}
            t.state, t.outcome, t.closed_at, t.updated_at = Turn.REPLIED, out, now, now
            mode = _emit(t, out, now, groups)
            t.save()
        else:  # no open turn (spontaneous, or its turn already ended): detached
            _to_inbox(m.owner_key, {"outcome": "reply", **base, "turnId": t.turn_id if t else None, "late": True},
                      groups)
            mode = "queued"
        wake_on_commit(groups)
    audit(caller.principal, "bridge.reply", "success", target_type="BridgeMember", target_id=m.session_id,
          detail=f"turn={t.turn_id if t else '-'} final={final} mode={mode}", correlation_id=cid)
    return {"delivered": True, "mode": mode, "turnId": t.turn_id if t else None}


def prepare_ask(caller, content, *, cid=""):
    """bridge_ask before the wait: surface the question on the worker's turn. Returns (turn pk, turn id, seq)."""
    require(caller, WORKER, "bridge_ask")
    check_content(content)
    now = timezone.now()
    groups = set()
    with transaction.atomic():
        m = Member.objects.select_for_update().get(pk=caller.member.pk)
        t = Turn.objects.select_for_update().filter(pk=m.current_turn_id).first() if m.current_turn_id else None
        if t is None or not t.active:
            t = Turn.objects.create(member=m, owner_key=m.owner_key, origin="worker", detached=True)
            m.current_turn = t
            m.save(update_fields=["current_turn"])
        t.ask_seq += 1
        t.state, t.question, t.updated_at = Turn.QUESTION, content, now
        out = {"outcome": "question", "text": content, "turnId": t.turn_id, "sessionId": m.session_id}
        mode = _emit(t, out, now, groups)
        t.save()
        wake_on_commit(groups)
    audit(caller.principal, "bridge.ask", "success", target_type="BridgeMember", target_id=m.session_id,
          detail=f"turn={t.turn_id} mode={mode}", correlation_id=cid)
    return t.pk, t.turn_id, t.ask_seq


def check_answer(turn_pk, seq, final=False):
    """The worker's ask waiter: the answer, or an ending; None to keep waiting."""
    if not final and Turn.objects.filter(pk=turn_pk, answer_seq__lt=seq, state=Turn.QUESTION).exists():
        return None  # still unanswered: no write lock taken
    with transaction.atomic():
        t = Turn.objects.select_for_update().get(pk=turn_pk)
        if t.answer_seq >= seq:
            return {"answer": t.answer, "turnId": t.turn_id}
        if t.state == Turn.GONE:
            return error_outcome("worker_gone", "this worker was stopped", t)
        if t.state == Turn.CANCELLED:
            return {"outcome": "cancelled", "turnId": t.turn_id}
        if not t.active:
            return {"outcome": "cancelled", "turnId": t.turn_id, "reason": f"turn ended ({t.state})"}
        if final:
            if t.state == Turn.QUESTION and t.ask_seq == seq:
                t.state, t.updated_at = Turn.OPEN, timezone.now()
                t.save(update_fields=["state", "updated_at"])
            return {"outcome": "timeout", "turnId": t.turn_id}
        return None


def cancel(caller, ident=None, *, cid=""):
    require(caller, PRIMARY, "bridge_cancel")
    m = resolve_worker(caller, ident)
    now = timezone.now()
    groups = set()
    with transaction.atomic():
        cur = Turn.objects.select_for_update().filter(pk=m.current_turn_id, state__in=Turn.ACTIVE).first() \
            if m.current_turn_id else None
        t = cur or Turn.objects.select_for_update().filter(member=m, state__in=Turn.ACTIVE).order_by("id").first()
        if t is None:
            return {"cancelled": False, "sessionId": m.session_id, "turnId": None, "interrupted": False}
        delivered = Message.objects.filter(turn=t, state__in=[Message.DELIVERED, Message.PICKED_UP]).exists()
        Message.objects.filter(turn=t, state=Message.QUEUED).update(state=Message.FAILED, error="cancelled")
        out = {"outcome": "cancelled", "turnId": t.turn_id, "sessionId": m.session_id}
        t.state, t.outcome, t.closed_at, t.updated_at = Turn.CANCELLED, out, now, now
        if t.waiter_until is not None and t.waiter_until > now and t.pending is None:
            t.pending = out
        t.save()
        groups.update({t.group, t.ask_group})
        wake_on_commit(groups)
    interrupted = False
    if delivered and m.pane_id:
        keys = (m.profile.interrupt_keys if m.profile else None) or ["Escape"]
        try:
            backend(m.socket_name).send_keys(m.pane_id, *keys)
            interrupted = True
        except TerminalError as exc:
            log.warning("interrupting %s: %s", m.session_id, exc)
    audit(caller.principal, "bridge.cancel", "success", target_type="BridgeMember", target_id=m.session_id,
          detail=f"turn={t.turn_id} interrupted={interrupted}", correlation_id=cid)
    return {"cancelled": True, "sessionId": m.session_id, "turnId": t.turn_id, "interrupted": interrupted}


# -- inbox -----------------------------------------------------------------------------------------


def inbox_items(key, limit=20):
    rows = InboxItem.objects.filter(recipient_key=key, acked_at__isnull=True).order_by("id")[:limit]
    return [{**(r.payload or {}), "id": r.item_id, "kind": r.kind, "createdAt": _iso(r.created_at)} for r in rows]


def ack(caller, ids):
    ids = list(dict.fromkeys(ids))
    mine = set(InboxItem.objects.filter(recipient_key=caller.inbox_key, item_id__in=ids).values_list("item_id", flat=True))
    InboxItem.objects.filter(recipient_key=caller.inbox_key, item_id__in=mine, acked_at__isnull=True).update(
        acked_at=timezone.now())
    return {"acked": [i for i in ids if i in mine], "unknown": [i for i in ids if i not in mine]}


# -- reads -----------------------------------------------------------------------------------------


def list_workers(caller):
    now = timezone.now()
    return [status_view(m, now) for m in Member.objects.select_related("current_turn")
            .filter(owner_key=caller.world_key, stopped_at__isnull=True)]


def status(caller, ident=None):
    now = timezone.now()
    if ident:
        m = _lookup(caller.world_key, ident)
        if m is None:
            raise BridgeFailure("unknown_worker", f"no worker '{ident}' of yours; bridge_list shows your workers")
        workers = [status_view(m, now)]
    else:
        workers = list_workers(caller)
    me = {"role": caller.role, "pending": pending_count(caller.inbox_key)}
    if caller.member is not None:
        me["sessionId"] = caller.member.session_id
    return {"workers": workers, "caller": me, "pending": me["pending"]}


def whoami(caller):
    if caller.member is not None:
        m = caller.member
        return {"role": WORKER, "sessionId": m.session_id, "paneId": m.pane_id, "terminalId": m.terminal_id,
                "profile": m.profile_name, "name": m.name, "primary": m.owner.get_username()}
    return {"role": PRIMARY, "sessionId": caller.principal.key, "name": caller.principal.name}


def observe(m, b=None, rules=None, now=None):
    """(status, source, detail) for one member: pane death → GONE; a recent hook status (newer than
    the last delivery) → it; else the pane title; else the screen rules."""
    now = now or timezone.now()
    if not m.pane_id:
        return AgentStatus.STARTING, "bridge", {}
    b = b or backend(m.socket_name)
    if not b.alive(m.pane_id):
        return AgentStatus.GONE, "pane", {}
    if m.hook_status and m.hook_at and m.hook_status != AgentStatus.GONE.value and \
            (now - m.hook_at).total_seconds() <= conf.hook_trust_seconds() and \
            (m.last_delivered_at is None or m.hook_at >= m.last_delivered_at):
        return AgentStatus(m.hook_status), "hook", {"event": m.hook_event}
    title = b.title(m.pane_id)
    by_title = status_from_title(title)
    if by_title is AgentStatus.WORKING:
        return by_title, "title", {"title": title}
    screen = b.read_screen(m.pane_id)
    st = classify(title, screen, rules)
    rule = matching_rule(screen, rules)
    source = "title" if by_title is not None and st is by_title else ("screen" if rule is not None else "none")
    return st, source, {"title": title, "rule": rule.name if rule is not None else None}


def read(caller, ident=None, source="recent"):
    require(caller, PRIMARY, "bridge_read")
    m = resolve_worker(caller, ident)
    b = backend(m.socket_name)
    out = {"sessionId": m.session_id, "paneId": m.pane_id, "source": source, "status": m.status}
    try:
        if source == "visible":
            out["text"] = b.read_screen(m.pane_id)
        elif source == "recent":
            out["text"] = b.read_tail(m.pane_id, 200)
        elif source == "recent_unwrapped":
            out["text"] = b.read_tail(m.pane_id, 200, join_wrapped=True)
        else:
            st, src, detail = observe(m, b)
            out["detection"] = {"status": st.value, "source": src, **detail,
                                "hookStatus": m.hook_status or None, "hookEvent": m.hook_event or None,
                                "hookAt": _iso(m.hook_at)}
            out["text"] = f"{st.value} (from {src})"
    except PaneNotFound:
        raise BridgeFailure("worker_gone", f"worker {m.session_id}'s pane is gone") from None
    except TerminalError as exc:
        raise BridgeFailure("terminal_error", f"reading the pane failed: {exc}", retryable=True, status=502) from None
    return out


# -- hooks -------------------------------------------------------------------------------------------


def hook_event(principal, ident, body):
    """The hook sink: a worker's own lifecycle hooks, authenticated with that worker's token."""
    caller = identify(principal)
    m = caller.member
    if m is None or ident not in (m.session_id, m.pane_id):
        raise BridgeFailure("unknown_worker", "this token is not the token of that worker")
    payload = body.get("payload") if isinstance(body.get("payload"), dict) else body
    event = str(body.get("event") or body.get("hook_event_name") or payload.get("hook_event_name") or "")[:64]
    st = status_from_hook(event, payload)
    if st is not None:
        Member.objects.filter(pk=m.pk).update(hook_status=st.value, hook_event=event, hook_at=timezone.now())
    return {"sessionId": m.session_id, "event": event or None, "status": st.value if st else None}


# -- Injector / StatusPoller helpers (called by bridge/poller.py) ----------------------------------------


def set_status(m, st, source, now=None):
    now = now or timezone.now()
    if m.status != st.value:
        Member.objects.filter(pk=m.pk).update(status=st.value, status_since=now, status_source=source)
        m.status, m.status_since, m.status_source = st.value, now, source
    elif m.status_source != source:
        Member.objects.filter(pk=m.pk).update(status_source=source)
        m.status_source = source


def claim_delivery(message, now=None):
    """queued → delivered (once: a second poller cannot claim it too); the turn becomes current."""
    now = now or timezone.now()
    with transaction.atomic():
        n = Message.objects.filter(pk=message.pk, state=Message.QUEUED).update(state=Message.DELIVERED, delivered_at=now)
        if not n:
            return False
        Member.objects.filter(pk=message.member_id).update(current_turn=message.turn_id, last_delivered_at=now)
    return True


def mark_picked_up(message, how="working"):
    Message.objects.filter(pk=message.pk, state=Message.DELIVERED).update(
        state=Message.PICKED_UP, picked_up_at=timezone.now(), error="" if how == "working" else f"pickup: {how}")


def fail_delivery(message, error):
    """A delivery failed at the backend: the message is dropped with an error to its sender."""
    now = timezone.now()
    groups = set()
    with transaction.atomic():
        Message.objects.filter(pk=message.pk).update(state=Message.FAILED, error=str(error)[:512])
        t = Turn.objects.select_for_update().select_related("member").filter(pk=message.turn_id).first()
        if t is not None and t.active:
            out = error_outcome("delivery_failed", f"the message could not be delivered to the worker's pane: {error}",
                                t, retryable=True)
            out["sessionId"] = t.member.session_id
            t.state, t.outcome, t.closed_at, t.updated_at = Turn.ERROR, out, now, now
            _emit(t, out, now, groups)
            t.save()
        wake_on_commit(groups)


def resolve_turn_done(turn, tail, notify=True):
    """Turn-done fallback: the worker went idle after picking the turn up, without bridge_reply.
    (``notify=False``: a turn the worker opened itself with bridge_ask just closes.)"""
    now = timezone.now()
    groups = set()
    with transaction.atomic():
        t = Turn.objects.select_for_update().select_related("member").get(pk=turn.pk)
        if not t.active:
            return False
        out = {"outcome": "turn_done", "text": tail, "turnId": t.turn_id, "sessionId": t.member.session_id}
        t.state, t.outcome, t.closed_at, t.updated_at = Turn.TURN_DONE, out, now, now
        if notify:
            _emit(t, out, now, groups)
        t.save()
        groups.update({t.group, t.ask_group})
        wake_on_commit(groups)
    return True


def sweep(now=None, grace=10):
    """Never lose an outcome: a pending outcome whose waiter is long past its deadline (its process
    died) moves to the inbox."""
    now = now or timezone.now()
    stranded = Turn.objects.filter(pending__isnull=False, waiter_until__lt=now - timedelta(seconds=grace))
    if not stranded.exists():
        return 0  # the common case: no write lock taken
    groups = set()
    moved = 0
    with transaction.atomic():
        for t in Turn.objects.select_for_update().filter(pending__isnull=False,
                                                         waiter_until__lt=now - timedelta(seconds=grace)):
            if t.pending is None:  # JSON null
                continue
            _to_inbox(t.owner_key, t.pending, groups)
            t.pending, t.waiter_until = None, None
            t.save(update_fields=["pending", "waiter_until"])
            moved += 1
        wake_on_commit(groups)
    return moved
