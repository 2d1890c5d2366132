"""The two profiles `make run` seeds (idempotently, on every migrate; an existing profile is never
overwritten, so an administrator's edits stay).

Which one is the default is decided when the first of them is created: ``claude-worker`` on a host where
Claude Code's CLI (``claude``) is on the PATH, else ``standin`` — so the first bridge_send of a fresh
installation without Claude Code reaches a worker that can answer. A profile is made default only when
no profile is default yet.
"""

import json
import shutil

from django.apps import apps

#: Claude Code hooks posting lifecycle events to the bridge's hook sink with the worker's own token.
#: The hook command runs in the worker's shell environment, so the token stays in that pane's env — and off every
#: command line: curl reads the header from a here-document on fd 3 (``-H @file``), since its argv, as every
#: process's, is readable by every user on the host (``ps``). The hook payload is curl's stdin.
HOOK_COMMAND = ('curl -s -m 3 -X POST -H @/dev/fd/3 -H "Content-Type: application/json" --data-binary @- '
                '"$YUZU_BRIDGE_EVENTS_URL" >/dev/null 2>&1 3<<EOF || true\n'
                'Authorization: Bearer $YUZU_BRIDGE_TOKEN\nEOF\n')
HOOK_EVENTS = ("SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Notification", "Stop", "SessionEnd")
CLAUDE_SETTINGS = json.dumps({"hooks": {e: [{"hooks": [{"type": "command", "command": HOOK_COMMAND}]}]
                                        for e in HOOK_EVENTS}}, separators=(",", ":"))
#: The bridge as the worker's only MCP server; ${VAR} is expanded by Claude Code from the pane's env.
CLAUDE_MCP_CONFIG = json.dumps({"mcpServers": {"bridged": {
    "type": "http", "url": "${YUZU_BRIDGE_URL}", "headers": {"Authorization": "Bearer ${YUZU_BRIDGE_TOKEN}"}}}},
    separators=(",", ":"))
WORKER_ADDENDUM = ("You are a worker session under the yuzu bridge. Your task arrives as a user message from the "
                   "primary session. When you have finished, call the bridge_reply tool with your result. If you "
                   "need a decision from the primary, call bridge_ask and continue with its answer. Do not contact "
                   "the primary any other way.")

SEEDS = {
    "claude-worker": {
        "description": "Claude Code worker, off the primary's subscription. An administrator must set "
                       "ANTHROPIC_BASE_URL (and its credentials) in env before it can spawn.",
        "agent_kind": "claude-code",
        "argv": ["claude", "--mcp-config", CLAUDE_MCP_CONFIG, "--settings", CLAUDE_SETTINGS,
                 "--append-system-prompt", "{addendum}"],
        "env": {},
        "cwd": "",
        "blocked_injectable": False,
        "requires_api_base_url": True,
        "system_prompt_addendum": WORKER_ADDENDUM,
        "interrupt_keys": ["Escape"],
    },
    "standin": {
        "description": "The scripted stand-in agent (bridge/testing/standin.py): calls no model and bills "
                       "nothing, so it is exempt from the ANTHROPIC_BASE_URL guard. For tests and demos.",
        "agent_kind": "standin",
        "argv": ["{python}", "-m", "bridge.testing.standin"],
        "env": {},
        "cwd": "{repo}",
        "blocked_injectable": True,
        "requires_api_base_url": False,
        "system_prompt_addendum": "",
        "interrupt_keys": ["Escape"],
    },
}


def default_seed():
    """The seed that becomes the default: claude-worker where its CLI is installed, else the stand-in."""
    return "claude-worker" if shutil.which(SEEDS["claude-worker"]["argv"][0]) else "standin"


def seed_profiles():
    """Create the missing seeds; returns their names."""
    Profile = apps.get_model("bridge", "Profile")
    default = None if Profile.objects.filter(is_default=True).exists() else default_seed()
    created = []
    for name, fields in SEEDS.items():
        _, made = Profile.objects.get_or_create(name=name, defaults={**fields, "is_default": name == default})
        if made:
            created.append(name)
    return created
