"""The bridge's state (spec docs/bridge.md): profiles, worker members, their message FIFOs, turns
(the rendezvous records) and the primaries' inboxes.

Everything a waiter needs is persisted here FIRST; the channel layer only wakes waiters, so a wake
lost across processes (or one that fired before the waiter subscribed) is recovered by re-reading
the row.
"""

import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from .status import AgentStatus

MAX_CONTENT_BYTES = 64 * 1024
STATUS_CHOICES = [(s.value, s.value) for s in AgentStatus]


def new_session_id():
    return "w" + secrets.token_hex(8)


def new_turn_id():
    return "t" + secrets.token_hex(10)


def new_inbox_id():
    return "i" + secrets.token_hex(10)


def _validate_argv(value):
    if not isinstance(value, list) or not value or not all(isinstance(a, str) and a for a in value):
        raise ValidationError("argv must be a non-empty JSON list of non-empty strings")


def _validate_env(value):
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and "=" not in k and isinstance(v, str) for k, v in value.items()
    ):
        raise ValidationError("env must be a JSON object of string names to string values")


def _validate_keys(value):
    if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
        raise ValidationError("interrupt keys must be a JSON list of tmux key names")


class Profile(models.Model):
    """How to start one kind of worker. ``env`` is what the worker gets (and never leaves the bridge
    through a tool); ``argv``, ``cwd`` and env values may use ``{python}``, ``{repo}`` and
    ``{addendum}`` placeholders."""

    KIND_CLAUDE = "claude-code"
    KIND_STANDIN = "standin"
    KIND_OTHER = "other"
    KINDS = [(KIND_CLAUDE, "Claude Code"), (KIND_STANDIN, "stand-in agent (tests)"), (KIND_OTHER, "other")]

    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=512, blank=True)
    agent_kind = models.CharField(max_length=32, choices=KINDS, default=KIND_CLAUDE)
    argv = models.JSONField(default=list, validators=[_validate_argv],
                            help_text='JSON list, e.g. ["claude"]; placeholders {python} {repo} {addendum}')
    env = models.JSONField(default=dict, blank=True, validators=[_validate_env],
                           help_text="JSON object: the worker's whole environment besides PATH/HOME/LANG/TERM and "
                                     "the bridge's own YUZU_BRIDGE_* variables. Must set ANTHROPIC_BASE_URL unless "
                                     "the profile is exempt.")
    cwd = models.CharField(max_length=1024, blank=True, help_text="Working directory (default: the bridge's repo)")
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

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def clean(self):
        if not self.requires_api_base_url and self.agent_kind != self.KIND_STANDIN:
            raise ValidationError({"requires_api_base_url": "only a stand-in profile may be exempt from the "
                                                            "subscription guard"})


class Member(models.Model):
    """One worker: a pane the bridge started, owned by the primary that spawned it."""

    session_id = models.CharField(max_length=32, unique=True, default=new_session_id, editable=False)
    name = models.CharField(max_length=128)
    profile = models.ForeignKey(Profile, null=True, on_delete=models.SET_NULL, related_name="members")
    profile_name = models.CharField(max_length=64)
    socket_name = models.CharField(max_length=128)
    terminal_id = models.CharField(max_length=128, blank=True)
    pane_id = models.CharField(max_length=32, blank=True, db_index=True)
    status = models.CharField(max_length=16, choices=STATUS_CHOICES, default=AgentStatus.STARTING.value)
    status_since = models.DateTimeField(default=timezone.now)
    status_source = models.CharField(max_length=16, blank=True)
    hook_status = models.CharField(max_length=16, blank=True, choices=STATUS_CHOICES)
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


class Turn(models.Model):
    """One exchange with a worker; the rendezvous record. ``pending`` holds an outcome for the live
    waiter (``waiter_until`` in the future); with no live waiter, outcomes go to the inbox."""

    OPEN, QUESTION, REPLIED, TURN_DONE, TIMEOUT, CANCELLED, GONE, ERROR = (
        "open", "question", "replied", "turn_done", "timeout", "cancelled", "gone", "error")
    STATES = (OPEN, QUESTION, REPLIED, TURN_DONE, TIMEOUT, CANCELLED, GONE, ERROR)
    ACTIVE = (OPEN, QUESTION, TIMEOUT)  # a worker may still reply/ask on these

    turn_id = models.CharField(max_length=32, unique=True, default=new_turn_id, editable=False)
    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="turns")
    owner_key = models.CharField(max_length=64, db_index=True)
    origin = models.CharField(max_length=8, default="primary")  # primary | worker (a spontaneous ask)
    detached = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=[(s, s) for s in STATES], default=OPEN)
    outcome = models.JSONField(null=True, blank=True)
    question = models.TextField(blank=True)
    answer = models.TextField(blank=True)
    ask_seq = models.PositiveIntegerField(default=0)
    answer_seq = models.PositiveIntegerField(default=0)
    waiter_until = models.DateTimeField(null=True, blank=True)
    pending = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    closed_at = models.DateTimeField(null=True, blank=True)

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
        return f"bridge.turn.{self.turn_id}"

    @property
    def ask_group(self):
        return f"bridge.ask.{self.turn_id}"


class Message(models.Model):
    """One entry of a worker's FIFO: text the Injector pastes into the pane in a safe window."""

    QUEUED, DELIVERED, PICKED_UP, FAILED = "queued", "delivered", "picked_up", "failed"
    STATES = (QUEUED, DELIVERED, PICKED_UP, FAILED)

    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="messages")
    turn = models.ForeignKey(Turn, null=True, blank=True, on_delete=models.SET_NULL, related_name="messages")
    content = models.TextField()
    state = models.CharField(max_length=16, choices=[(s, s) for s in STATES], default=QUEUED)
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


class InboxItem(models.Model):
    """A detached delivery for a principal (a reply with no live waiter, a question, a note, an
    error): returned by bridge_poll on every poll until bridge_ack (at-least-once)."""

    KINDS = ("reply", "question", "note", "error")  # payload.outcome says reply or turn_done

    item_id = models.CharField(max_length=32, unique=True, default=new_inbox_id, editable=False)
    recipient_key = models.CharField(max_length=64, db_index=True)
    kind = models.CharField(max_length=16, choices=[(k, k) for k in KINDS])
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)
    acked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["recipient_key", "acked_at"])]

    def __str__(self):
        return f"{self.item_id} {self.kind} → {self.recipient_key}"
