"""Agent status detection for status-gated delivery (bridge spec §5).

Pure functions: no settings, no database. ``AgentStatus`` is a Django ``TextChoices`` so that the one
vocabulary of a worker's status is also the choices of ``Member.status`` and ``Member.hook_status``.
Sources, most trusted first:

1. the agent's lifecycle hooks posting to the bridge -> :func:`status_from_hook`;
2. the pane title -> :func:`status_from_title` (Claude Code puts a braille
   spinner, U+2800..U+28FF, at the start of its title while working and ``✳``
   when idle);
3. screen rules on the bottom lines of the visible screen, kept in the
   versioned data file ``bridge/screen_rules.json`` -> :func:`load_rules`,
   :func:`status_from_screen`.

:func:`classify` combines 2 and 3. Precedence:

* a spinner title is decisive: ``WORKING``;
* an idle (``✳``) title gives ``IDLE`` -- unless a ``BLOCKED`` screen rule
  matches (a permission/trust dialog is waiting while the spinner is stopped);
* no title signal: the first matching screen rule decides;
* nothing matches: ``UNKNOWN`` (not injectable, not a pickup -- wait).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from django.db.models import TextChoices

__all__ = [
    "AgentStatus",
    "DEFAULT_RULES_PATH",
    "RULES_VERSION",
    "RulesError",
    "ScreenRule",
    "ScreenRules",
    "classify",
    "load_rules",
    "status_from_hook",
    "status_from_screen",
    "status_from_title",
]

DEFAULT_RULES_PATH = Path(__file__).with_name("screen_rules.json")
RULES_VERSION = 1

IDLE_TITLE_MARK = "\u2733"  # ✳
BRAILLE_FIRST, BRAILLE_LAST = 0x2800, 0x28FF


class AgentStatus(TextChoices):
    """A worker's status (``str(status)`` is its value, "IDLE", not "AgentStatus.IDLE")."""

    IDLE = "IDLE", "idle"
    WORKING = "WORKING", "working"
    BLOCKED = "BLOCKED", "blocked (awaiting input)"
    UNKNOWN = "UNKNOWN", "unknown"
    STARTING = "STARTING", "starting"  # kept by the bridge: pane started, agent not up yet
    GONE = "GONE", "gone"  # kept by the bridge: pane/agent gone

    @property
    def injectable(self) -> bool:
        """May the Injector deliver the head of the FIFO now? (§5 table).

        BLOCKED is injectable by default; a per-profile setting may turn that
        off -- that policy lives with the Injector, not here.
        """
        return self in (AgentStatus.IDLE, AgentStatus.BLOCKED)

    @property
    def counts_as_pickup(self) -> bool:
        """Does this state confirm the last delivered message was picked up?"""
        return self is AgentStatus.WORKING


class RulesError(ValueError):
    """The screen-rules file is missing, malformed or of an unknown version."""


_RULE_STATUSES = {AgentStatus.WORKING, AgentStatus.BLOCKED, AgentStatus.IDLE}


@dataclass(frozen=True)
class ScreenRule:
    name: str
    status: AgentStatus
    pattern: re.Pattern[str]
    bottom_lines: int

    def matches(self, screen: str) -> bool:
        return self.pattern.search(bottom_lines(screen, self.bottom_lines)) is not None


@dataclass(frozen=True)
class ScreenRules:
    version: int
    rules: tuple[ScreenRule, ...]
    source: str = "<memory>"

    def __iter__(self):
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)


def _parse_rules(data: Any, source: str) -> ScreenRules:
    if not isinstance(data, dict):
        raise RulesError(f"{source}: top level must be an object")
    version = data.get("version")
    if version != RULES_VERSION:
        raise RulesError(f"{source}: unsupported rules version {version!r} (want {RULES_VERSION})")
    raw_rules = data.get("rules")
    if not isinstance(raw_rules, list):
        raise RulesError(f"{source}: 'rules' must be a list")
    rules = []
    for i, raw in enumerate(raw_rules):
        where = f"{source}: rule #{i}"
        if not isinstance(raw, dict):
            raise RulesError(f"{where} must be an object")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise RulesError(f"{where}: 'name' must be a non-empty string")
        try:
            status = AgentStatus(raw.get("status", ""))
        except ValueError:
            status = None
        if status not in _RULE_STATUSES:
            raise RulesError(f"{where} ({name}): 'status' must be WORKING, BLOCKED or IDLE")
        pattern = raw.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise RulesError(f"{where} ({name}): 'pattern' must be a non-empty string")
        try:
            compiled = re.compile(pattern, re.MULTILINE)
        except re.error as exc:
            raise RulesError(f"{where} ({name}): bad pattern: {exc}") from exc
        n = raw.get("bottom_lines")
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise RulesError(f"{where} ({name}): 'bottom_lines' must be a positive integer")
        rules.append(ScreenRule(name=name, status=status, pattern=compiled, bottom_lines=n))
    return ScreenRules(version=version, rules=tuple(rules), source=source)


def load_rules(path: str | os.PathLike[str] | None = None) -> ScreenRules:
    """Load and validate a screen-rules file (default ``bridge/screen_rules.json``)."""
    p = Path(path) if path is not None else DEFAULT_RULES_PATH
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RulesError(f"cannot read screen rules {p}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise RulesError(f"{p}: invalid JSON: {exc}") from exc
    return _parse_rules(data, str(p))


@lru_cache(maxsize=1)
def _default_rules() -> ScreenRules:
    return load_rules()


def bottom_lines(screen: str, n: int) -> str:
    """The last ``n`` lines of ``screen`` after dropping trailing blank lines."""
    rows = screen.splitlines()
    while rows and not rows[-1].strip():
        rows.pop()
    return "\n".join(rows[-n:]) if n > 0 else ""


def status_from_title(title: str | None) -> AgentStatus | None:
    """WORKING for a leading braille spinner char, IDLE for a leading ``✳``."""
    t = (title or "").lstrip()
    if not t:
        return None
    if BRAILLE_FIRST <= ord(t[0]) <= BRAILLE_LAST:
        return AgentStatus.WORKING
    if t[0] == IDLE_TITLE_MARK:
        return AgentStatus.IDLE
    return None


def status_from_screen(
    screen: str, rules: ScreenRules | Iterable[ScreenRule] | None = None
) -> AgentStatus | None:
    """Status of the first matching screen rule, or None."""
    rule = matching_rule(screen, rules)
    return rule.status if rule is not None else None


def matching_rule(
    screen: str, rules: ScreenRules | Iterable[ScreenRule] | None = None
) -> ScreenRule | None:
    """The first rule (in file order) that matches ``screen``, or None."""
    for rule in _default_rules() if rules is None else rules:
        if rule.matches(screen or ""):
            return rule
    return None


def classify(
    title: str | None,
    screen: str | None,
    rules: ScreenRules | Iterable[ScreenRule] | None = None,
) -> AgentStatus:
    """Classify a pane from its title and visible screen (see module doc)."""
    by_title = status_from_title(title)
    if by_title is AgentStatus.WORKING:
        return AgentStatus.WORKING
    by_screen = status_from_screen(screen or "", rules)
    if by_title is AgentStatus.IDLE:
        return AgentStatus.BLOCKED if by_screen is AgentStatus.BLOCKED else AgentStatus.IDLE
    return by_screen or AgentStatus.UNKNOWN


# -- lifecycle hooks ---------------------------------------------------------

_PERMISSION_NOTIFICATION_TYPES = {"permission_prompt", "elicitation_dialog"}
_IDLE_NOTIFICATION_TYPES = {"idle_prompt"}


def status_from_hook(event_name: str | None, payload: Mapping[str, Any] | None = None) -> AgentStatus | None:
    """Map a Claude Code hook event to a status; None if it says nothing.

    * ``SessionStart`` -> IDLE (the agent is up at its prompt), except
      ``source: "compact"``, which can fire mid-turn -> None;
    * ``UserPromptSubmit``, ``PreToolUse``, ``PostToolUse`` -> WORKING
      (a turn is running; PostToolUse also ends a permission wait);
    * ``Stop`` -> IDLE (turn finished);
    * ``Notification`` -> BLOCKED when it is a permission request
      (``notification_type`` permission_prompt/elicitation_dialog, or a
      message mentioning permission), IDLE for the "waiting for your input"
      idle notice, else None;
    * ``SessionEnd`` -> GONE;
    * anything else (SubagentStop, PreCompact, unknown) -> None.

    ``event_name`` falls back to ``payload["hook_event_name"]``.
    """
    payload = payload or {}
    event = event_name or payload.get("hook_event_name") or ""
    if event == "SessionStart":
        return None if payload.get("source") == "compact" else AgentStatus.IDLE
    if event in ("UserPromptSubmit", "PreToolUse", "PostToolUse"):
        return AgentStatus.WORKING
    if event == "Stop":
        return AgentStatus.IDLE
    if event == "SessionEnd":
        return AgentStatus.GONE
    if event == "Notification":
        kind = str(payload.get("notification_type") or "")
        message = str(payload.get("message") or "").lower()
        if kind in _PERMISSION_NOTIFICATION_TYPES or "permission" in message:
            return AgentStatus.BLOCKED
        if kind in _IDLE_NOTIFICATION_TYPES or "waiting for your input" in message:
            return AgentStatus.IDLE
        return None
    return None
