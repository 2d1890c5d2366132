"""Status detection (spec §5): screen rules, pane titles, hook events.

Pure Python: no tmux, no Django. Screen fixtures live in
tests/bridge/fixtures/screens/ (hand-made; see the README there).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.status import (
    DEFAULT_RULES_PATH,
    AgentStatus,
    RulesError,
    classify,
    load_rules,
    matching_rule,
    status_from_hook,
    status_from_screen,
    status_from_title,
)

SCREENS = Path(__file__).resolve().parent / "fixtures" / "screens"
RULES = load_rules()


def screen(name):
    return (SCREENS / name).read_text(encoding="utf-8")


# -- the rules file ----------------------------------------------------------------


def test_default_rules_file_is_versioned_and_complete():
    data = json.loads(DEFAULT_RULES_PATH.read_text(encoding="utf-8"))
    assert data["version"] == 1 and RULES.version == 1
    assert [r.name for r in RULES] == ["permission_dialog", "trust_dialog", "esc_to_interrupt", "prompt_box"]
    assert {r.status for r in RULES} == {AgentStatus.BLOCKED, AgentStatus.WORKING, AgentStatus.IDLE}
    assert all(r.bottom_lines > 0 for r in RULES)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"version": 2, "rules": []}, "version"),
        ({"version": 1}, "rules"),
        ({"version": 1, "rules": [{"name": "x", "status": "GONE", "pattern": "x", "bottom_lines": 1}]}, "status"),
        ({"version": 1, "rules": [{"name": "x", "status": "IDLE", "pattern": "(", "bottom_lines": 1}]}, "pattern"),
        ({"version": 1, "rules": [{"name": "x", "status": "IDLE", "pattern": "x", "bottom_lines": 0}]}, "bottom_lines"),
        ({"version": 1, "rules": [{"status": "IDLE", "pattern": "x", "bottom_lines": 1}]}, "name"),
    ],
)
def test_bad_rules_files_are_rejected(tmp_path, data, message):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RulesError, match=message):
        load_rules(path)


def test_unreadable_rules_file(tmp_path):
    with pytest.raises(RulesError):
        load_rules(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(RulesError, match="invalid JSON"):
        load_rules(tmp_path / "bad.json")


def test_custom_rules_file_is_used(tmp_path):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"version": 1, "rules": [
        {"name": "custom_busy", "status": "WORKING", "pattern": "crunching", "bottom_lines": 2},
    ]}))
    rules = load_rules(path)
    assert classify("", "crunching numbers\n", rules) is AgentStatus.WORKING
    assert classify("", screen("idle.txt"), rules) is AgentStatus.UNKNOWN


# -- screen fixtures -----------------------------------------------------------------


@pytest.mark.parametrize(
    "fixture, status, rule",
    [
        ("idle.txt", AgentStatus.IDLE, "prompt_box"),
        ("working.txt", AgentStatus.WORKING, "esc_to_interrupt"),
        ("permission_dialog.txt", AgentStatus.BLOCKED, "permission_dialog"),
        ("trust_dialog.txt", AgentStatus.BLOCKED, "trust_dialog"),
    ],
)
def test_fixture_screens_classify(fixture, status, rule):
    text = screen(fixture)
    assert matching_rule(text, RULES).name == rule
    assert status_from_screen(text, RULES) is status
    # A title with no status signal (e.g. the host name) leaves it to the screen.
    assert classify("devbox", text, RULES) is status
    assert classify("", text) is status  # default rules


def test_all_fixtures_are_covered():
    assert {p.name for p in SCREENS.glob("*.txt")} == {
        "idle.txt", "working.txt", "permission_dialog.txt", "trust_dialog.txt",
    }


def test_nothing_matching_is_unknown():
    assert classify("", "", RULES) is AgentStatus.UNKNOWN
    assert classify("bash", "$ ls\nREADME.md  manage.py\n$ \n", RULES) is AgentStatus.UNKNOWN


def test_rules_only_look_at_the_bottom_lines():
    old_busy = "✻ Thinking… (esc to interrupt)\n" + "\n".join(f"output {i}" for i in range(20))
    assert classify("", old_busy + "\n", RULES) is AgentStatus.UNKNOWN
    assert classify("", old_busy + "\n> \n", RULES) is AgentStatus.IDLE
    # Trailing blank rows (the empty bottom of a screen) do not use up the window.
    assert classify("", "✻ Thinking… (esc to interrupt)\n" + "\n" * 40, RULES) is AgentStatus.WORKING


def test_other_permission_dialog_wordings_block():
    edit = "│ Do you want to make this edit to parser.py?\n│ ❯ 1. Yes\n│   2. No\n"
    assert classify("", edit, RULES) is AgentStatus.BLOCKED


def test_prompt_variants_are_idle():
    for prompt in (">", "> ", "│ >", "│ > draft text   │", "  > "):
        assert classify("", f"some output\n{prompt}\n", RULES) is AgentStatus.IDLE, prompt
    assert classify("", "bridge_reply -> {}\n", RULES) is AgentStatus.UNKNOWN  # '>' mid-line


# -- titles --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "title, status",
    [
        ("⠋ Fixing the parser", AgentStatus.WORKING),
        ("⠏", AgentStatus.WORKING),
        ("\u2800 blank braille", AgentStatus.WORKING),
        ("\u28ff", AgentStatus.WORKING),
        ("✳ Claude Code", AgentStatus.IDLE),
        ("  ✳ padded", AgentStatus.IDLE),
        ("Claude Code", None),
        ("devbox", None),
        ("", None),
        (None, None),
    ],
)
def test_status_from_title(title, status):
    assert status_from_title(title) is status


def test_title_comes_before_screen_rules():
    # A spinner title is decisive, whatever the screen shows.
    assert classify("⠙ Working", screen("idle.txt"), RULES) is AgentStatus.WORKING
    assert classify("⠙ Working", "", RULES) is AgentStatus.WORKING
    assert classify("⠙ Working", screen("permission_dialog.txt"), RULES) is AgentStatus.WORKING
    # An idle title wins over stale busy text ...
    assert classify("✳ Claude Code", screen("working.txt"), RULES) is AgentStatus.IDLE
    assert classify("✳ Claude Code", "", RULES) is AgentStatus.IDLE
    # ... but a dialog on screen means the idle-looking agent is waiting: BLOCKED.
    assert classify("✳ Claude Code", screen("permission_dialog.txt"), RULES) is AgentStatus.BLOCKED
    assert classify("✳ Claude Code", screen("trust_dialog.txt"), RULES) is AgentStatus.BLOCKED


# -- status properties & hooks -------------------------------------------------------


def test_gating_properties():
    assert {s for s in AgentStatus if s.injectable} == {AgentStatus.IDLE, AgentStatus.BLOCKED}
    assert {s for s in AgentStatus if s.counts_as_pickup} == {AgentStatus.WORKING}
    assert str(AgentStatus.IDLE) == "IDLE" and AgentStatus("GONE") is AgentStatus.GONE


@pytest.mark.parametrize(
    "event, payload, status",
    [
        ("SessionStart", {"source": "startup"}, AgentStatus.IDLE),
        ("SessionStart", {"source": "resume"}, AgentStatus.IDLE),
        ("SessionStart", {"source": "compact"}, None),
        ("UserPromptSubmit", {"prompt": "do X"}, AgentStatus.WORKING),
        ("PreToolUse", {"tool_name": "Bash"}, AgentStatus.WORKING),
        ("PostToolUse", {"tool_name": "Bash"}, AgentStatus.WORKING),
        ("Stop", {"stop_hook_active": False}, AgentStatus.IDLE),
        ("Notification", {"message": "Claude needs your permission to use Bash"}, AgentStatus.BLOCKED),
        ("Notification", {"message": "x", "notification_type": "permission_prompt"}, AgentStatus.BLOCKED),
        ("Notification", {"message": "Claude is waiting for your input"}, AgentStatus.IDLE),
        ("Notification", {"message": "Build finished"}, None),
        ("SessionEnd", {"reason": "exit"}, AgentStatus.GONE),
        ("SubagentStop", {}, None),
        ("PreCompact", {}, None),
        ("SomethingNew", {}, None),
    ],
)
def test_status_from_hook(event, payload, status):
    assert status_from_hook(event, payload) is status


def test_hook_event_name_from_payload():
    assert status_from_hook(None, {"hook_event_name": "Stop"}) is AgentStatus.IDLE
    assert status_from_hook("", {"hook_event_name": "UserPromptSubmit"}) is AgentStatus.WORKING
    assert status_from_hook("Stop", None) is AgentStatus.IDLE
    assert status_from_hook(None, None) is None
