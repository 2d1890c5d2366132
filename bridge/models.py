"""The bridge's state (docs/bridge.md) and every change to it: profiles, worker members, their message
FIFOs, turns (the rendezvous records) and the primaries' inboxes.

Invariants the methods below keep:

* **Row first, then the wake.** Everything a waiter needs is persisted here before anyone is woken;
  the channel layer only says "re-read now" (bridge/wakeups.py), so a wake lost across processes, or
  one that fired before the waiter subscribed, is recovered by re-reading the row.
* **An outcome is never lost** (``Turn.hand_over``): it becomes the turn's ``pending`` outcome when a
  waiter is live (``waiter_until`` in the future, nothing pending yet), else an ``InboxItem`` that
  bridge_poll returns until bridge_ack.
* **Each state machine has one vocabulary**, the ``TextChoices`` its field uses: ``AgentStatus`` for a
  member's status (and its hook status), ``Turn.State``, ``Message.State``, ``InboxItem.Kind``, ``Role``
  for who opened a turn.
* **Claims are conditional UPDATEs**: a message goes queued → delivered once (``Message.claim``), so
  two pollers cannot both paste it.
* **Lock order: Member, then Turn.** Methods documented "on a locked row" expect the caller's
  ``transaction.atomic()`` to hold ``select_for_update()`` on that row; the others take their own locks.
"""

import json
import re
import secrets
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import F, Q
from django.utils import timezone

from yuzu.models import ApiToken
from yuzu.secrets import seal, sealed_column, unseal

from .failures import error_outcome
from .status import AgentStatus
from .terminal import pane_target
from .wakeups import ask_group, inbox_group, turn_group, wake_on_commit

MAX_CONTENT_BYTES = 64 * 1024
RESEND_WINDOW = timedelta(minutes=10)  # how long after a dropped wait the same message counts as its re-send
#: The profile bridge_send falls back to when none is flagged default.
FALLBACK_PROFILE_NAME = "claude-worker"


def new_session_id():
    return "w" + secrets.token_hex(8)


def new_turn_id():
    return "t" + secrets.token_hex(10)


def new_inbox_id():
    return "i" + secrets.token_hex(10)


def _iso(dt):
    return dt.isoformat() if dt else None


def _validate_argv(value):
    if not isinstance(value, list) or not value or not all(isinstance(a, str) and a for a in value):
        raise ValidationError("argv must be a non-empty JSON list of non-empty strings")


def _validate_env(value):
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and "=" not in k and isinstance(v, str) for k, v in value.items()
    ):
        raise ValidationError("env must be a JSON object of string names to string values")


#: a POSIX user name as useradd accepts it (and nothing a command line or tmux could read as more)
_RUN_AS_RE = re.compile(r"[a-z_][a-z0-9_.-]{0,31}\$?")


def _validate_run_as(value):
    if value and not _RUN_AS_RE.fullmatch(value):
        raise ValidationError("run_as must be an OS user name (lower-case letters, digits, '_', '.', '-'; at most 32)")


def _validate_keys(value):
    if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
        raise ValidationError("interrupt keys must be a JSON list of tmux key names")


class Role(models.TextChoices):
    """Who a bridge caller is (decided from its token, bridge/identity.py) and who opened a turn."""

    PRIMARY = "primary", "primary"
    WORKER = "worker", "worker"


class ProfileQuerySet(models.QuerySet):
    def update(self, **kwargs):
        """``update(env=…)`` seals the environment once per row (the blob is bound to its row's pk)."""
        if "env" not in kwargs:
            return super().update(**kwargs)
        env = kwargs.pop("env")
        _validate_env(env)
        moved = 0
        with transaction.atomic():
            for pk in list(self.values_list("pk", flat=True)):
                moved += Profile.objects.filter(pk=pk).update(env_sealed=seal_env(env, pk), **kwargs)
        return moved

    def default(self):
        """The profile bridge_send auto-spawns: the first enabled one flagged default, else the fallback."""
        enabled = self.filter(enabled=True)
        return (enabled.filter(is_default=True).order_by("id").first()
                or enabled.filter(name=FALLBACK_PROFILE_NAME).first())


class Profile(models.Model):
    """How to start one kind of worker. ``env`` is what the worker gets (and never leaves the bridge
    through a tool); ``argv``, ``cwd`` and env values may use ``{python}``, ``{repo}`` and
    ``{addendum}`` placeholders."""

    class Kind(models.TextChoices):
        CLAUDE = "claude-code", "Claude Code"
        STANDIN = "standin", "stand-in agent (tests)"
        OTHER = "other", "other"

    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=512, blank=True)
    agent_kind = models.CharField(max_length=32, choices=Kind.choices, default=Kind.CLAUDE)
    argv = models.JSONField(default=list, validators=[_validate_argv],
                            help_text='JSON list, e.g. ["claude"]; placeholders {python} {repo} {addendum}')
    env_sealed = models.BinaryField(null=True, blank=True, editable=False,
                                    help_text="the worker's environment (``env``), sealed with yuzu.secrets: it "
                                              "often holds API credentials, so a database dump never shows it")
    cwd = models.CharField(max_length=1024, blank=True,
                           help_text="Working directory (default: the bridge's repo; with run_as, that user's home)")
    run_as = models.CharField(
        max_length=32, blank=True, validators=[_validate_run_as],
        help_text="The OS user the worker runs as (blank: the server's own user). The IsolationGuard refuses a real "
                  "agent as the server's own user unless YUZU_BRIDGE_SAME_USER_WORKERS=1; a run_as user needs the "
                  "server to run as root and a cwd that user may enter (docs/bridge.md, Isolating workers).")
    blocked_injectable = models.BooleanField(
        default=True, help_text="Deliver messages while the worker is BLOCKED (awaiting input, e.g. a dialog)")
    requires_api_base_url = models.BooleanField(
        default=True, help_text="SubscriptionGuard: refuse to spawn unless env sets ANTHROPIC_BASE_URL. Only a "
                                "stand-in profile (which bills nothing) may turn this off.")
    system_prompt_addendum = models.TextField(blank=True)
    interrupt_keys = models.JSONField(default=list, blank=True, validators=[_validate_keys],
                                      help_text='tmux keys bridge_cancel sends, e.g. ["Escape"]')
    is_default = models.BooleanField(default=False, help_text="The profile bridge_send auto-spawns")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    objects = ProfileQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def env(self):
        """JSON object: the worker's whole environment besides PATH/HOME/LANG/TERM and the bridge's own
        YUZU_BRIDGE_* variables. Must set ANTHROPIC_BASE_URL unless the profile is exempt. Stored sealed."""
        if "_env" not in self.__dict__:
            blob = self.env_sealed
            self.__dict__["_env"] = json.loads(unseal(blob, PROFILE_ENV.where(self.pk))) if blob else {}
        return self.__dict__["_env"]

    @env.setter
    def env(self, value):
        self.__dict__["_env"] = dict(value or {})
        self.__dict__["_env_dirty"] = True

    def save(self, *args, **kwargs):
        dirty = self.__dict__.pop("_env_dirty", False)
        if dirty and self.pk is not None:
            self.env_sealed = seal_env(self.env, self.pk)
            if kwargs.get("update_fields") is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "env_sealed"}
        super().save(*args, **kwargs)
        if dirty and self.env_sealed is None and self.env:  # a new row: its pk exists only now
            self.env_sealed = seal_env(self.env, self.pk)
            Profile.objects.filter(pk=self.pk).update(env_sealed=self.env_sealed)

    def clean(self):
        _validate_env(self.env)
        if not self.requires_api_base_url and self.agent_kind != self.Kind.STANDIN:
            raise ValidationError({"requires_api_base_url": "only a stand-in profile may be exempt from the "
                                                            "subscription guard"})

    @property
    def spawnable(self):
        """The SubscriptionGuard's rule (bridge/guard.py): the profile's env sets ANTHROPIC_BASE_URL (the
        worker runs off the machine's subscription), or it is a stand-in that declares itself exempt
        (it calls no model)."""
        exempt = not self.requires_api_base_url and self.agent_kind == self.Kind.STANDIN
        return exempt or bool(str((self.env or {}).get("ANTHROPIC_BASE_URL", "")).strip())

    @property
    def runs_commands(self):
        """The IsolationGuard's question (bridge/guard.py): whether a worker of this profile may run what a model
        decides (every kind but the scripted stand-in, which calls no model and runs nothing it is sent)."""
        return self.agent_kind != self.Kind.STANDIN

    def to_dict(self, default_id=None):
        """What bridge_profiles shows: never ``env``."""
        return {"name": self.name, "description": self.description, "agentKind": self.agent_kind,
                "default": self.pk == default_id, "blockedInjectable": self.blocked_injectable,
                "spawnable": self.spawnable}


PROFILE_ENV = sealed_column("bridge", Profile, "env_sealed")


def seal_env(env, pk):
    return seal(json.dumps(env, sort_keys=True), PROFILE_ENV.where(pk))


class MemberQuerySet(models.QuerySet):
    def live(self):
        return self.filter(stopped_at__isnull=True)

    def lookup(self, world_key, ident):
        """A member of this primary's world by session id, pane id or terminal id; live ones first."""
        return (self.select_related("profile", "current_turn")
                .filter(owner_key=world_key).filter(Q(session_id=ident) | Q(pane_id=ident) | Q(terminal_id=ident))
                .order_by(F("stopped_at").asc(nulls_first=True), "-id").first())


class Member(models.Model):
    """One worker: a pane the bridge started, owned by the primary that spawned it."""

    class Source(models.TextChoices):
        """Where the current status came from (most trusted first)."""

        BRIDGE = "bridge", "the bridge (starting, stopped)"
        PANE = "pane", "pane death"
        HOOK = "hook", "lifecycle hook"
        TITLE = "title", "pane title"
        SCREEN = "screen", "screen rules"
        NONE = "none", "nothing matched"

    session_id = models.CharField(max_length=32, unique=True, default=new_session_id, editable=False)
    name = models.CharField(max_length=128)
    profile = models.ForeignKey(Profile, null=True, on_delete=models.SET_NULL, related_name="members")
    profile_name = models.CharField(max_length=64)
    socket_name = models.CharField(max_length=128)
    terminal_id = models.CharField(max_length=128, blank=True)
    pane_id = models.CharField(max_length=32, blank=True, db_index=True)
    status = models.CharField(max_length=16, choices=AgentStatus.choices, default=AgentStatus.STARTING)
    status_since = models.DateTimeField(default=timezone.now)
    status_source = models.CharField(max_length=16, blank=True, choices=Source.choices)
    hook_status = models.CharField(max_length=16, blank=True, choices=AgentStatus.choices)
    hook_event = models.CharField(max_length=64, blank=True)
    hook_at = models.DateTimeField(null=True, blank=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="bridge_members")
    owner_key = models.CharField(max_length=64, db_index=True)
    token = models.OneToOneField("yuzu.ApiToken", null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="bridge_member")
    current_turn = models.ForeignKey("Turn", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    last_delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)
    stop_reason = models.CharField(max_length=256, blank=True)

    objects = MemberQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self):
        return f"{self.session_id} ({self.profile_name} {self.pane_id or '-'})"

    @property
    def live(self):
        return self.stopped_at is None

    @property
    def agent_status(self):
        return AgentStatus(self.status)

    @property
    def busy(self):
        """Something is queued or in flight, or a turn is open."""
        return self.messages.filter(state__in=Message.IN_FLIGHT).exists() or (
            self.current_turn_id is not None and self.current_turn.active)

    # -- state changes ---------------------------------------------------------------------------

    @property
    def pane(self):
        """How the bridge addresses this worker's pane in tmux (bridge.terminal.pane_target): never a bare pane id,
        which tmux hands out again once its server restarted."""
        return pane_target(self.terminal_id, self.pane_id)

    def pane_started(self, pane_id, terminal_id):
        """Record the pane the spawn started. Returns whether the worker is still live: one stopped while its pane
        was starting (its row is listed before it has a pane) keeps the ids, and the spawn must close that pane."""
        live = Member.objects.filter(pk=self.pk, stopped_at__isnull=True).update(pane_id=pane_id,
                                                                              terminal_id=terminal_id)
        if not live:
            Member.objects.filter(pk=self.pk).update(pane_id=pane_id, terminal_id=terminal_id)
        self.pane_id, self.terminal_id = pane_id, terminal_id
        return bool(live)

    def set_status(self, status, source, now=None):
        """Record what the StatusPoller observed; ``status_since`` moves only when the status changes."""
        now = now or timezone.now()
        if self.status != status:
            Member.objects.filter(pk=self.pk).update(status=status, status_since=now, status_source=source)
            self.status, self.status_since, self.status_source = status, now, source
        elif self.status_source != source:
            Member.objects.filter(pk=self.pk).update(status_source=source)
            self.status_source = source

    def record_hook(self, status, event, now=None):
        """A lifecycle hook of the worker reported ``status`` (trusted for YUZU_BRIDGE_HOOK_TRUST_SECONDS)."""
        now = now or timezone.now()
        Member.objects.filter(pk=self.pk).update(hook_status=status, hook_event=event, hook_at=now)
        self.hook_status, self.hook_event, self.hook_at = status, event, now

    def queue(self, content, *, owner_key, deadline=None):
        """On a locked live member: a new turn carrying ``content`` as the next FIFO entry. ``deadline``
        is the live waiter's (None: detached, outcomes go to the inbox)."""
        turn = Turn.objects.create(member=self, owner_key=owner_key, detached=deadline is None,
                                   waiter_until=deadline)
        Message.objects.create(member=self, turn=turn, content=content)
        return turn

    def locked_current_turn(self):
        """On a locked member: its current turn, locked (Member, then Turn), or None."""
        if self.current_turn_id is None:
            return None
        turn = Turn.objects.select_for_update().filter(pk=self.current_turn_id).first()
        if turn is not None:
            turn.member = self
        return turn

    def open_own_turn(self):
        """On a locked member: a turn the worker opens itself (a bridge_ask outside any delegated turn),
        now its current turn."""
        turn = Turn.objects.create(member=self, owner_key=self.owner_key, origin=Role.WORKER, detached=True)
        self.current_turn = turn
        self.save(update_fields=["current_turn"])
        return turn

    def mark_gone(self, reason, now=None):
        """The worker is gone (stopped, its pane died, its spawn failed): stopped with status GONE, its
        token revoked, its queue failed and its open turns ended ``gone`` — waiters get worker_gone, a
        detached turn's failure goes to the inbox. Idempotent; takes its own locks. Returns whether this call
        stopped it (False: it was stopped already, by whoever stopped it first, whose reason stays)."""
        now = now or timezone.now()
        with transaction.atomic():
            # A conditional UPDATE, so that of two stops at once (the primary's bridge_stop, the poller's sweep)
            # exactly one is the one that stopped it, on every database (SQLite has no row locks).
            stopped = bool(Member.objects.filter(pk=self.pk, stopped_at__isnull=True).update(
                stopped_at=now, stop_reason=reason[:256], status=AgentStatus.GONE, status_since=now,
                status_source=Member.Source.BRIDGE))
            m = Member.objects.select_for_update().get(pk=self.pk)
            if m.token_id:
                ApiToken.objects.filter(pk=m.token_id, revoked_at__isnull=True).update(revoked_at=now)
            m.messages.filter(state__in=Message.IN_FLIGHT).update(state=Message.State.FAILED,
                                                                  error=f"worker_gone: {m.stop_reason}"[:512])
            for t in Turn.objects.select_for_update().filter(member=m, state__in=Turn.ACTIVE):
                out = error_outcome("worker_gone", f"worker {m.session_id} is gone ({m.stop_reason})", t.turn_id)
                out["sessionId"] = m.session_id
                t.end(Turn.State.GONE, out, now)
        self.stopped_at, self.stop_reason, self.status = m.stopped_at, m.stop_reason, m.status
        return stopped

    # -- output shapes -----------------------------------------------------------------------------

    def to_dict(self):
        return {"sessionId": self.session_id, "name": self.name, "terminalId": self.terminal_id,
                "paneId": self.pane_id, "profile": self.profile_name, "status": self.status,
                "agent_status": self.status, "statusSince": _iso(self.status_since), "live": self.live}

    def status_dict(self, now=None):
        """``to_dict`` plus the queue and rendezvous state (bridge_status, bridge_list)."""
        now = now or timezone.now()
        view = self.to_dict()
        turns = self.turns.all()
        view.update({
            "queueDepth": self.messages.filter(state__in=Message.IN_FLIGHT).count(),
            "rendezvousOpen": turns.filter(Q(waiter_until__gt=now) | Q(state=Turn.State.QUESTION)).exists(),
            "currentTurnId": self.current_turn.turn_id if self.current_turn_id and self.current_turn.active else None,
            "openTurns": turns.filter(state__in=Turn.ACTIVE).count(),
            "statusSource": self.status_source or None,
        })
        if not self.live:
            view["stoppedAt"] = _iso(self.stopped_at)
            view["stopReason"] = self.stop_reason
        return view


def move_world(old_key, new_key):
    """The primary ``old_key``'s world becomes ``new_key``'s (its token was rotated: bridge/identity.py): its workers,
    live and stopped, every turn it opened and its unacknowledged inbox. Returns (the live workers moved, how many
    inbox items moved). Takes its own locks (the live workers first, so a send holding one finishes before)."""
    with transaction.atomic():
        live = list(Member.objects.select_for_update().filter(owner_key=old_key, stopped_at__isnull=True)
                    .order_by("id"))
        Member.objects.filter(owner_key=old_key).update(owner_key=new_key)
        Turn.objects.filter(owner_key=old_key).update(owner_key=new_key)
        items = InboxItem.objects.filter(recipient_key=old_key, acked_at__isnull=True).update(recipient_key=new_key)
        if items:
            wake_on_commit(inbox_group(new_key))
    return live, items


def holds_world(key):
    """Whether anything of the primary ``key``'s world is still under that key: a worker, an active turn, an
    unacknowledged inbox item."""
    return (Member.objects.filter(owner_key=key, stopped_at__isnull=True).exists()
            or Turn.objects.filter(owner_key=key, state__in=Turn.ACTIVE).exists()
            or InboxItem.objects.pending(key).exists())


class TurnQuerySet(models.QuerySet):
    def stranded(self, before):
        """Turns holding a pending outcome whose waiter's deadline passed before ``before`` (its process died)."""
        return self.filter(pending__isnull=False, waiter_until__lt=before)


class Turn(models.Model):
    """One exchange with a worker; the rendezvous record. ``pending`` holds an outcome for the live
    waiter (``waiter_until`` in the future); with no live waiter, outcomes go to the inbox."""

    class State(models.TextChoices):
        OPEN = "open", "open"
        QUESTION = "question", "question (the worker waits for an answer)"
        REPLIED = "replied", "replied"
        TURN_DONE = "turn_done", "turn done (no reply)"
        TIMEOUT = "timeout", "timeout (the primary stopped waiting)"
        CANCELLED = "cancelled", "cancelled"
        GONE = "gone", "gone (the worker vanished)"
        ERROR = "error", "error (delivery failed)"

    ACTIVE = (State.OPEN, State.QUESTION, State.TIMEOUT)  # a worker may still reply/ask on these

    turn_id = models.CharField(max_length=32, unique=True, default=new_turn_id, editable=False)
    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="turns")
    owner_key = models.CharField(max_length=64, db_index=True)
    origin = models.CharField(max_length=8, choices=Role.choices, default=Role.PRIMARY)
    detached = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=State.choices, default=State.OPEN)
    outcome = models.JSONField(null=True, blank=True)
    question = models.TextField(blank=True)
    answer = models.TextField(blank=True)
    ask_seq = models.PositiveIntegerField(default=0)
    answer_seq = models.PositiveIntegerField(default=0)
    waiter_until = models.DateTimeField(null=True, blank=True)
    pending = models.JSONField(null=True, blank=True)
    # Re-sends (a 2026-07-28 client re-sends a call whose response stream broke): when the primary's waiter went
    # away with its client, and which of the worker's asks lost its waiter the same way.
    dropped_at = models.DateTimeField(null=True, blank=True)
    ask_dropped_seq = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    closed_at = models.DateTimeField(null=True, blank=True)

    objects = TurnQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["state", "waiter_until"])]

    def __str__(self):
        return f"{self.turn_id} {self.state}"

    @property
    def active(self):
        return self.state in self.ACTIVE

    @property
    def group(self):
        return turn_group(self.turn_id)

    @property
    def ask_group(self):
        return ask_group(self.turn_id)

    @property
    def open_question(self):
        """The worker asked and nobody has answered yet."""
        return self.state == self.State.QUESTION and self.ask_seq > self.answer_seq

    def waiter_live(self, now):
        return self.waiter_until is not None and self.waiter_until > now and self.pending is None

    # -- the outcome delivery rule (on a locked row) ------------------------------------------------

    def hand_over(self, outcome, now):
        """Give ``outcome`` to the turn's live waiter (``pending``), else to the primary's inbox.
        Returns the mode, "resolved" or "queued". The caller saves the turn and wakes its waiter."""
        if self.waiter_live(now):
            self.pending = outcome
            return "resolved"
        InboxItem.deliver(self.owner_key, outcome)
        return "queued"

    def end(self, state, outcome, now=None, *, notify=True):
        """Close the turn with ``outcome`` (handed over unless ``notify=False``), save it and wake both
        of its waiters. Returns the hand-over mode (None when not notified)."""
        now = now or timezone.now()
        self.state, self.outcome, self.closed_at, self.updated_at = state, outcome, now, now
        mode = self.hand_over(outcome, now) if notify else None
        self.save()
        wake_on_commit(self.group, self.ask_group)
        return mode

    def ask(self, content, now=None):
        """The worker asks ``content`` on this turn: the question goes to the primary's waiter or inbox.
        Returns the hand-over mode."""
        now = now or timezone.now()
        self.ask_seq += 1
        self.state, self.question, self.updated_at = self.State.QUESTION, content, now
        out = {"outcome": "question", "text": content, "turnId": self.turn_id, "sessionId": self.member.session_id}
        mode = self.hand_over(out, now)
        self.save()
        wake_on_commit(self.group)
        return mode

    def answer_question(self, content, deadline=None, now=None):
        """The primary answers the open question; it waits again until ``deadline`` (None: detached).
        Wakes the worker's bridge_ask."""
        now = now or timezone.now()
        self.answer, self.answer_seq, self.state, self.updated_at = content, self.ask_seq, self.State.OPEN, now
        self.waiter_until = deadline
        self.detached = self.detached or deadline is None
        self.save()
        wake_on_commit(self.ask_group)

    def resume(self, deadline=None, now=None):
        """The primary re-sent the answer it already gave (its response was lost: a dropped stream, which a
        2026-07-28 client answers by re-sending): the question is not answered twice. An ended turn's outcome
        is returned at once (None otherwise); an active one gets this waiter (``deadline``; None: detached)."""
        if not self.active:
            if self.pending is not None and self.pending == self.outcome:
                # the outcome was kept for a waiter that died with its process: it is answered now, not swept
                # into the inbox as well
                self.pending, self.waiter_until = None, None
                self.save(update_fields=["pending", "waiter_until"])
            return self.outcome
        self.waiter_until, self.updated_at = deadline, now or timezone.now()
        self.detached = self.detached or deadline is None
        self.save(update_fields=["waiter_until", "detached", "updated_at"])
        return None

    def cancel(self, now=None):
        """Abandon the turn: its queued messages fail, a live waiter gets ``cancelled`` (no inbox item).
        Returns whether a message of it had already reached the pane (so the worker should be interrupted)."""
        now = now or timezone.now()
        delivered = self.messages.filter(state__in=[Message.State.DELIVERED, Message.State.PICKED_UP]).exists()
        self.messages.filter(state=Message.State.QUEUED).update(state=Message.State.FAILED, error="cancelled")
        out = {"outcome": "cancelled", "turnId": self.turn_id, "sessionId": self.member.session_id}
        if self.waiter_live(now):
            self.pending = out
        self.end(self.State.CANCELLED, out, now, notify=False)
        return delivered

    def take_pending(self):
        """The live waiter takes its outcome."""
        out = self.pending
        self.pending, self.waiter_until = None, None
        self.save(update_fields=["pending", "waiter_until"])
        return out

    def stop_waiting(self, now=None):
        """The waiter's deadline passed: outcomes from now on go to the inbox; an open turn itself goes
        on as ``timeout`` (the worker may still reply)."""
        self.waiter_until = None
        if self.state == self.State.OPEN:
            self.state, self.updated_at = self.State.TIMEOUT, now or timezone.now()
        self.save(update_fields=["waiter_until", "state", "updated_at"])
        return {"outcome": "timeout", "turnId": self.turn_id, "sessionId": self.member.session_id}

    def release_waiter(self, now=None):
        """The waiter went away (its client disconnected): a pending outcome moves to the inbox, and so will
        later ones. The drop is remembered: the client's re-send of the same message finds this turn again
        (turns.prepare_send) instead of starting a second one."""
        if self.pending is not None:
            InboxItem.deliver(self.owner_key, self.pending)
        self.pending, self.waiter_until, self.dropped_at = None, None, now or timezone.now()
        self.save(update_fields=["pending", "waiter_until", "dropped_at"])

    def resent(self, content, now):
        """Whether a new-turn bridge_send of ``content`` now is a re-send of this turn's own message: its waiter
        dropped with its client within RESEND_WINDOW, and it was the same text."""
        if self.dropped_at is None or self.dropped_at < now - RESEND_WINDOW or self.origin != Role.PRIMARY:
            return False
        first = self.messages.order_by("id").values_list("content", flat=True).first()
        return first == content

    def orphaned(self, content, now):
        """Whether this turn's waiter may have died with its server process: one registered (``waiter_until``)
        that neither took an outcome nor recorded a drop, on the primary's own message ``content``, within
        RESEND_WINDOW. Only the caller's wait lease can tell a dead waiter from a live one (turns.prepare_send)."""
        if self.waiter_until is None or self.dropped_at is not None or self.origin != Role.PRIMARY \
                or self.created_at < now - RESEND_WINDOW:
            return False
        first = self.messages.order_by("id").values_list("content", flat=True).first()
        return first == content

    def ask_result(self, seq, final, now=None):
        """For the worker's bridge_ask number ``seq``: the answer, or how the turn ended; None to keep
        waiting. At the deadline (``final``) the unanswered question is withdrawn → timeout."""
        if self.answer_seq >= seq:
            return {"answer": self.answer, "turnId": self.turn_id}
        if self.state == self.State.GONE:
            return error_outcome("worker_gone", "this worker was stopped", self.turn_id)
        if self.state == self.State.CANCELLED:
            return {"outcome": "cancelled", "turnId": self.turn_id}
        if not self.active:
            return {"outcome": "cancelled", "turnId": self.turn_id, "reason": f"turn ended ({self.state})"}
        if final:
            if self.state == self.State.QUESTION and self.ask_seq == seq:
                self.state, self.updated_at = self.State.OPEN, now or timezone.now()
                self.save(update_fields=["state", "updated_at"])
            return {"outcome": "timeout", "turnId": self.turn_id}
        return None

    def resolve_turn_done(self, tail, *, notify=True):
        """Turn-done fallback: the worker went idle after picking the turn up, without bridge_reply; the
        outcome is the terminal's tail (``notify=False``: a turn the worker opened itself just closes).
        False if the turn had already ended. Takes its own locks."""
        with transaction.atomic():
            t = Turn.objects.select_for_update().select_related("member").get(pk=self.pk)
            if not t.active:
                return False
            out = {"outcome": "turn_done", "text": tail, "turnId": t.turn_id, "sessionId": t.member.session_id}
            t.end(self.State.TURN_DONE, out, notify=notify)
        return True


class Message(models.Model):
    """One entry of a worker's FIFO: text the Injector pastes into the pane in a safe window."""

    class State(models.TextChoices):
        QUEUED = "queued", "queued"
        DELIVERED = "delivered", "delivered (awaiting pickup)"
        PICKED_UP = "picked_up", "picked up"
        FAILED = "failed", "failed"

    IN_FLIGHT = (State.QUEUED, State.DELIVERED)  # still the worker's business: its queue depth

    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="messages")
    turn = models.ForeignKey(Turn, null=True, blank=True, on_delete=models.SET_NULL, related_name="messages")
    content = models.TextField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    picked_up_at = models.DateTimeField(null=True, blank=True)
    error = models.CharField(max_length=512, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["member", "state"])]

    def clean(self):
        if len(self.content.encode("utf-8")) > MAX_CONTENT_BYTES:
            raise ValidationError({"content": "content exceeds 64 KiB"})

    def claim(self, now=None):
        """queued → delivered, once (a second poller cannot claim it too); its turn becomes the member's
        current turn. False if it was no longer queued."""
        now = now or timezone.now()
        with transaction.atomic():
            if not Message.objects.filter(pk=self.pk, state=self.State.QUEUED).update(
                    state=self.State.DELIVERED, delivered_at=now):
                return False
            Member.objects.filter(pk=self.member_id).update(current_turn=self.turn_id, last_delivered_at=now)
        self.state, self.delivered_at = self.State.DELIVERED, now
        return True

    def mark_picked_up(self, how="working"):
        """delivered → picked_up: the worker took it (``how`` says what showed it, when not WORKING)."""
        Message.objects.filter(pk=self.pk, state=self.State.DELIVERED).update(
            state=self.State.PICKED_UP, picked_up_at=timezone.now(), error="" if how == "working" else f"pickup: {how}")

    def fail_delivery(self, error):
        """The terminal refused the paste: the message is dropped, and its turn ends with a retryable
        delivery_failed for its sender — the FIFO moves on."""
        now = timezone.now()
        with transaction.atomic():
            Message.objects.filter(pk=self.pk).update(state=self.State.FAILED, error=str(error)[:512])
            t = Turn.objects.select_for_update().select_related("member").filter(pk=self.turn_id).first()
            if t is not None and t.active:
                out = error_outcome("delivery_failed", f"the message could not be delivered to the worker's pane: "
                                                       f"{error}", t.turn_id, retryable=True)
                out["sessionId"] = t.member.session_id
                t.end(Turn.State.ERROR, out, now)


class InboxItemQuerySet(models.QuerySet):
    def pending(self, key):
        """Unacknowledged items for a principal, oldest first."""
        return self.filter(recipient_key=key, acked_at__isnull=True).order_by("id")

    def ack(self, key, ids):
        """Acknowledge a principal's items. Returns (acked, unknown) in the order given; another
        principal's id is unknown. Acking twice is harmless."""
        ids = list(dict.fromkeys(ids))
        mine = set(self.filter(recipient_key=key, item_id__in=ids).values_list("item_id", flat=True))
        self.filter(recipient_key=key, item_id__in=mine, acked_at__isnull=True).update(acked_at=timezone.now())
        return [i for i in ids if i in mine], [i for i in ids if i not in mine]


class InboxItem(models.Model):
    """A detached delivery for a principal (a reply with no live waiter, a question, a note, an
    error): returned by bridge_poll on every poll until bridge_ack (at-least-once)."""

    class Kind(models.TextChoices):  # payload.outcome says reply or turn_done
        REPLY = "reply", "reply"
        QUESTION = "question", "question"
        NOTE = "note", "note"
        ERROR = "error", "error"

        @classmethod
        def of(cls, outcome):
            return {"question": cls.QUESTION, "reply": cls.REPLY, "turn_done": cls.REPLY, "note": cls.NOTE,
                    "cancelled": cls.NOTE}.get(outcome.get("outcome"), cls.ERROR)

    item_id = models.CharField(max_length=32, unique=True, default=new_inbox_id, editable=False)
    recipient_key = models.CharField(max_length=64, db_index=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)
    acked_at = models.DateTimeField(null=True, blank=True)

    objects = InboxItemQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["recipient_key", "acked_at"])]

    def __str__(self):
        return f"{self.item_id} {self.kind} → {self.recipient_key}"

    @classmethod
    def deliver(cls, key, outcome):
        """Queue ``outcome`` for principal ``key`` and wake its bridge_poll."""
        item = cls.objects.create(recipient_key=key, kind=cls.Kind.of(outcome), payload=outcome)
        wake_on_commit(inbox_group(key))
        return item

    def to_dict(self):
        return {**(self.payload or {}), "id": self.item_id, "kind": self.kind, "createdAt": _iso(self.created_at)}
