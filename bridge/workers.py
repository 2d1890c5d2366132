"""Workers: their panes and their lifecycle — spawn, address, observe, stop.

Invariants:

* **Guard before side effects.** A spawn resolves its profile and passes the SubscriptionGuard and the
  IsolationGuard (bridge/guard.py) before any row, token or pane exists; a refusal is audited ``denied``.
* **One token per worker, for its pane only.** The worker's token (audience "bridge", expiring after
  YUZU_BRIDGE_WORKER_TOKEN_HOURS) is minted with its Member in one transaction and handed only to the
  pane's environment; no tool ever returns it. A pane that cannot start leaves a stopped Member and a
  revoked token, never a live worker without a pane.
* **A primary addresses only its own workers** (``resolve_worker``, ``Member.objects.lookup``): by
  sessionId, paneId, terminal id or profile name, inside the caller's world.
* **Stopping is idempotent** and ends everything the worker had: pane closed, token revoked, queue
  failed, open turns ended ``gone`` (``terminate`` → ``Member.mark_gone``).
* **Status comes from the most trusted source** (``observe``): pane death → GONE; a hook status newer
  than the last delivery and within YUZU_BRIDGE_HOOK_TRUST_SECONDS; the pane title; the screen rules.
* The bridge only ever touches panes on its own tmux server (``backend``), one per installation.
"""

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from yuzu import rbac
from yuzu.audit import audit
from yuzu.models import ApiToken
from yuzu.rbac import Principal

from . import conf
from .failures import BridgeFailure
from .guard import IsolationGuard, SubscriptionGuard, substitute, worker_env
from .identity import PRIMARY, follow_rotation, identify, require
from .models import InboxItem, Member, Profile
from .status import (
    AgentStatus,
    classify,
    matching_rule,
    status_from_hook,
    status_from_title,
)
from .terminal import TerminalError, TmuxBackend

log = logging.getLogger("yuzu.bridge")

_backends: dict[str, TmuxBackend] = {}


def backend(socket_name=None):
    """The terminal backend of a tmux server (default: this installation's)."""
    name = socket_name or conf.socket_name()
    b = _backends.get(name)
    if b is None:
        b = _backends[name] = TmuxBackend(name)
    return b


def resolve_profile(name=None):
    if name:
        profile = Profile.objects.filter(name=name, enabled=True).first()
        if profile is None:
            raise BridgeFailure("unknown_profile", f"no enabled profile '{name}'; bridge_profiles lists them")
        return profile
    profile = Profile.objects.default()
    if profile is None:
        raise BridgeFailure("unknown_profile", "no default profile is configured; pass profile")
    return profile


def spawn(caller, profile_name=None, *, primary_pane=None, cid=""):
    """Start a worker pane from a profile. Returns the Member."""
    require(caller, PRIMARY, "bridge_spawn")
    profile = resolve_profile(profile_name)
    sock = conf.socket_name()
    try:
        SubscriptionGuard.check_spawn(profile, primary_pane, sock)
        run_as, cwd = IsolationGuard.check_spawn(profile, substitute(profile.cwd, profile))
    except BridgeFailure as exc:
        audit(caller.principal, "bridge.spawn", "denied", target_type="BridgeProfile", target_id=profile.name,
              detail=f"reason={exc.code}", correlation_id=cid)
        raise
    now, limit = timezone.now(), conf.max_workers()
    with transaction.atomic():
        # Counted per user, whatever token each worker was spawned with; one spawn at a time per user (the row
        # locked), so that the count holds until the new row exists.
        list(type(caller.principal.user).objects.select_for_update().filter(pk=caller.principal.user.pk).values("pk"))
        running = Member.objects.live().filter(owner=caller.principal.user).count()
        if running < limit:
            member = Member(owner=caller.principal.user, owner_key=caller.world_key, profile=profile,
                            profile_name=profile.name, socket_name=sock)
            member.name = f"{profile.name}-{member.session_id[-4:]}"
            token, raw = ApiToken.mint(caller.principal.user, f"bridge worker {member.session_id}",
                                       audience=ApiToken.AUDIENCE_BRIDGE,
                                       expires_at=now + timedelta(hours=conf.worker_token_hours()), now=now)
            member.token = token
            member.save()
    if running >= limit:
        audit(caller.principal, "bridge.spawn", "denied", target_type="BridgeProfile", target_id=profile.name,
              detail=f"reason=worker_limit live={running}", correlation_id=cid)
        raise BridgeFailure("worker_limit", f"you have {running} live workers (with all your tokens), the most one user may have "
                            f"(YUZU_BRIDGE_MAX_WORKERS={limit}); bridge_stop one you no longer need (bridge_list "
                            "shows them)")
    argv = substitute(list(profile.argv or []), profile)
    try:
        info = backend(sock).start(f"bridge-{member.session_id}", argv, worker_env(profile, member, raw), cwd,
                                   user=run_as)
    except TerminalError as exc:
        member.mark_gone(f"spawn failed: {exc}")
        audit(caller.principal, "bridge.spawn", "failure", target_type="BridgeMember", target_id=member.session_id,
              detail=f"profile={profile.name} error={exc}", correlation_id=cid)
        raise BridgeFailure("spawn_failed", f"could not start a pane for profile '{profile.name}': {exc}",
                            retryable=True) from None
    if not member.pane_started(info.pane_id, info.terminal_id):
        # Stopped while its pane started (bridge_stop by its sessionId from bridge_list, the poller's sweep): the
        # pane must not run on, unpolled, outside the user's worker allowance.
        terminate(member, "stopped while its pane was starting")
        audit(caller.principal, "bridge.spawn", "failure", target_type="BridgeMember", target_id=member.session_id,
              detail=f"profile={profile.name} pane={info.pane_id} error=stopped while starting", correlation_id=cid)
        raise BridgeFailure("worker_gone", f"worker {member.session_id} was stopped while its pane was starting")
    audit(caller.principal, "bridge.spawn", "success", target_type="BridgeMember", target_id=member.session_id,
          detail=f"profile={profile.name} pane={info.pane_id} socket={sock} run_as={run_as or '-'}",
          correlation_id=cid)
    return member


def _choose(members):
    """Among several candidate workers, prefer one with nothing queued and no open turn."""
    return next((m for m in members if not m.busy), members[0])


def resolve_worker(caller, ident=None, *, auto_spawn=False, cid=""):
    """The worker a primary addresses: sessionId / paneId / terminal id / profile name; by default
    the sole worker, else the default profile's worker, else (auto_spawn) a new one."""
    world = caller.world_key
    live = list(Member.objects.live().select_related("profile", "current_turn").filter(owner_key=world))
    if ident:
        exact = Member.objects.lookup(world, ident)
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
    default = Profile.objects.default()
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


def stop(caller, ident, *, primary_pane=None, cid=""):
    """Tear down a worker. Idempotent: stopping a stopped or unknown worker succeeds (wasRunning false)."""
    require(caller, PRIMARY, "bridge_stop")
    m = Member.objects.lookup(caller.world_key, ident)
    if m is None:
        return {"paneId": ident, "sessionId": None, "stopped": True, "wasRunning": False}
    SubscriptionGuard.check_primary_pane(primary_pane, m.socket_name, m)
    was = terminate(m, "stopped by the primary")  # False: stopped already, or by the poller at this very moment
    audit(caller.principal, "bridge.stop", "success", target_type="BridgeMember", target_id=m.session_id,
          detail=f"pane={m.pane_id} was_running={was}", correlation_id=cid)
    return {"paneId": m.pane_id or ident, "sessionId": m.session_id, "stopped": True, "wasRunning": was}


def terminate(member, reason, *, close=True):
    """The worker is gone (stopped, or its pane died): close its pane, then ``Member.mark_gone``. A pane its spawn
    recorded after ``member`` was read (the row is listed before its pane exists) is closed too: once the worker is
    marked gone, a spawn still starting closes its own (``Member.pane_started``), so between them none runs on.
    Returns whether this call stopped it (``Member.mark_gone``): of two stops at once, only one did."""
    if close and member.pane_id:
        _close(member)
    stopped = member.mark_gone(reason)
    if close:
        now = Member.objects.filter(pk=member.pk).values("pane_id", "terminal_id").first()
        if now is not None and now["pane_id"] and (now["pane_id"], now["terminal_id"]) != (member.pane_id,
                                                                                           member.terminal_id):
            member.pane_id, member.terminal_id = now["pane_id"], now["terminal_id"]
            _close(member)
    return stopped


def _close(member):
    try:
        backend(member.socket_name).close(member.pane)
    except TerminalError as exc:
        log.warning("closing pane %s of %s: %s", member.pane_id, member.session_id, exc)


def stop_orphans(socket_name):
    """Stop the live workers whose primary can no longer call: its token revoked or expired (an OAuth connection's
    access token only once the connection cannot refresh it), its user deactivated or gone — or its user no longer
    holds Bridge:Execute (an administrator took the role away). Nobody could read, answer or stop them any more (a
    primary's world is its token), and each would go on running an agent in its pane and holding its user's
    YUZU_BRIDGE_MAX_WORKERS allowance. A token that was rotated hands its workers to its live successor instead
    (``identity.follow_rotation``): they are that primary's. Returns how many were stopped."""
    live = Member.objects.live().filter(socket_name=socket_name)
    stopped = 0
    for key in set(live.values_list("owner_key", flat=True)):
        principal = Principal.from_key(key)
        if principal is None and _refreshable(key):
            continue  # an OAuth primary's access token lapsed: its client's next refresh makes it this primary again
        if principal is None and follow_rotation(key) is not None:
            continue  # the successor's liveness and grants are checked at the next sweep, under its own key
        if principal is None:
            reason, why = "primary_revoked", "its primary's token or user is no longer valid"
        elif not rbac.has_any(principal, "Bridge", "Execute"):
            reason, why = "primary_unauthorized", "its primary's user no longer holds Bridge:Execute"
        else:
            continue
        for m in live.filter(owner_key=key).select_related("owner"):
            if terminate(m, why):
                audit("system", "bridge.stop", "success", target_type="BridgeMember", target_id=m.session_id,
                      detail=f"pane={m.pane_id} reason={reason} owner={m.owner.get_username()} world={key}")
                stopped += 1
    return stopped


def stop_expired(socket_name, now=None):
    """Stop the live workers whose own token ended — expired (it lives YUZU_BRIDGE_WORKER_TOKEN_HOURS), revoked or
    deleted: the worker can no longer reply, ask or report a hook, and its pane would run on unanswerable, holding its
    user's allowance. Its turns end ``worker_gone`` (the primary's waiter, else its inbox) and ``bridge_status``
    shows the reason. A worker's token is never renewed: its pane got it once, at spawn. Returns how many stopped."""
    now = now or timezone.now()
    ended = (Member.objects.live().filter(socket_name=socket_name)
             .filter(Q(token__isnull=True) | Q(token__revoked_at__isnull=False) | Q(token__expires_at__lte=now))
             .select_related("token", "owner"))
    stopped = 0
    for m in ended:
        expired = m.token is not None and m.token.revoked_at is None
        reason = "worker_token_expired" if expired else "worker_token_revoked"
        why = "its worker token expired" if expired else "its worker token was revoked or deleted"
        if terminate(m, why):
            audit("system", "bridge.stop", "success", target_type="BridgeMember", target_id=m.session_id,
                  detail=f"pane={m.pane_id} reason={reason} owner={m.owner.get_username()} world={m.owner_key}")
            stopped += 1
    return stopped


_REAP_BATCH = 500  # rows deleted per transaction by reap_history


def reap_history(now=None):
    """Delete the bridge's history past YUZU_BRIDGE_HISTORY_DAYS (none when 0): workers stopped before then, with
    their turns and messages, and inbox items acknowledged before then. A live worker, its open turns, its queue
    and an item its primary has not acknowledged are never touched (the inbox is bounded by YUZU_BRIDGE_MAX_INBOX
    instead). Every poller of a shared database may run it: deleting what is gone already is nothing. Returns
    the rows deleted, per model."""
    days = conf.history_days()
    if not days:
        return {}
    cutoff = (now or timezone.now()) - timedelta(days=days)
    deleted: dict[str, int] = {}
    for model, old in ((Member, Q(stopped_at__lt=cutoff)), (InboxItem, Q(acked_at__lt=cutoff))):
        while ids := list(model.objects.filter(old).values_list("pk", flat=True)[:_REAP_BATCH]):
            _, counts = model.objects.filter(pk__in=ids).delete()  # a batch per transaction: a backlog blocks nobody
            for label, n in counts.items():  # "bridge.Turn": 3
                name = label.rsplit(".", 1)[1]
                deleted[name] = deleted.get(name, 0) + n
    return {name: n for name, n in deleted.items() if n}


def _refreshable(key):
    """Whether the primary ``key`` names is an OAuth connection whose lapsed access token its client may still
    refresh (the same token row, so the same primary and world): its user active, the connection live."""
    token_id = Principal.token_id_of(key)
    token = ApiToken.objects.filter(pk=token_id, owner__is_active=True).first() if token_id else None
    return token is not None and token.renewable()


def observe(m, b=None, rules=None, now=None):
    """(status, source, detail) for one member: pane death → GONE; a recent hook status (newer than
    the last delivery) → it; else the pane title; else the screen rules."""
    now = now or timezone.now()
    if not m.pane_id:
        return AgentStatus.STARTING, Member.Source.BRIDGE, {}
    b = b or backend(m.socket_name)
    if not b.alive(m.pane):
        return AgentStatus.GONE, Member.Source.PANE, {}
    if m.hook_status and m.hook_at and m.hook_status != AgentStatus.GONE and \
            (now - m.hook_at).total_seconds() <= conf.hook_trust_seconds() and \
            (m.last_delivered_at is None or m.hook_at >= m.last_delivered_at):
        return AgentStatus(m.hook_status), Member.Source.HOOK, {"event": m.hook_event}
    title = b.title(m.pane)
    by_title = status_from_title(title)
    if by_title is AgentStatus.WORKING:
        return by_title, Member.Source.TITLE, {"title": title}
    screen = b.read_screen(m.pane)
    st = classify(title, screen, rules)
    rule = matching_rule(screen, rules)
    if by_title is not None and st is by_title:
        source = Member.Source.TITLE
    else:
        source = Member.Source.SCREEN if rule is not None else Member.Source.NONE
    return st, source, {"title": title, "rule": rule.name if rule is not None else None}


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
        m.record_hook(st, event)
    return {"sessionId": m.session_id, "event": event or None, "status": st.value if st else None}
