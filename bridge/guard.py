"""The SubscriptionGuard: workers stay off the primary's subscription and away from the primary's pane.

Invariants:

* **No worker on the primary's subscription.** A profile whose env lacks ANTHROPIC_BASE_URL would start
  a worker on the subscription the machine is logged in with (the primary's): its spawn is refused with
  ``subscription_boundary``, unless the profile is a stand-in that declares itself exempt
  (``requires_api_base_url=False``; it calls no model). The rule is ``Profile.spawnable``.
* **A worker's environment is built from nothing** (``worker_env``): PATH/HOME/LANG of the bridge process,
  TERM, the profile's env, then the bridge's own YUZU_BRIDGE_* variables (which a profile cannot
  override). No other variable of the bridge process — none of its ANTHROPIC_* — reaches a worker.
* **No tool takes or returns an environment value**; only this module reads a profile's env for a spawn.
* **Not beside the primary's pane.** A primary that says where its own pane lives (REST header
  ``X-Bridge-Pane``) must not live on the bridge's private tmux server: the bridge closes panes there and
  may shut that server down. The server is named as a real pane knows it (``$TMUX:$TMUX_PANE``, see
  ``tmux_server``) or by its ``-L`` name; a hint that names none is taken to mean the bridge's.
"""

import os
import re
import sys

from . import conf
from .failures import BridgeFailure

#: environment variables a worker may inherit from the bridge process; nothing else ever is.
INHERITED_ENV = ("PATH", "HOME", "LANG")
BRIDGE_ENV = ("YUZU_BRIDGE_URL", "YUZU_BRIDGE_TOKEN", "YUZU_BRIDGE_SESSION_ID", "YUZU_BRIDGE_EVENTS_URL")


class SubscriptionGuard:
    """The spawn and stop checks (see the module docstring)."""

    @staticmethod
    def check_spawn(profile, primary_pane=None, socket_name=None):
        if not profile.spawnable:
            raise BridgeFailure(
                "subscription_boundary",
                f"profile '{profile.name}' does not set ANTHROPIC_BASE_URL, so a worker started from it would run "
                "on the primary's subscription; an administrator must set it in the profile's env (admin → "
                "Bridge → Profiles) before it can be spawned")
        SubscriptionGuard.check_primary_pane(primary_pane, socket_name or conf.socket_name())

    @staticmethod
    def check_primary_pane(primary_pane, socket_name, member=None):
        if not primary_pane:
            return
        sock, _, pane = primary_pane.rpartition(":")  # a pane id holds no colon; a socket path may
        on_bridge_server = tmux_server(sock or socket_name) == socket_name
        if member is not None and on_bridge_server and pane in (member.pane_id, member.terminal_id):
            raise BridgeFailure("subscription_boundary", _pane_refusal(
                primary_pane, sock, socket_name,
                f"it names this worker's pane ({pane}) as the primary's own, which the bridge will not close"))
        if member is None and on_bridge_server:
            raise BridgeFailure("subscription_boundary", _pane_refusal(
                primary_pane, sock, socket_name, "the bridge will not manage workers beside the primary's pane (it "
                "closes panes on that server and may shut it down)"))


def _pane_refusal(hint, sock, socket_name, what):
    """The refusal of an ``X-Bridge-Pane`` hint, with what the caller can fix: a hint that names no tmux server is
    taken to mean the bridge's (erring safe), which the caller may not have meant."""
    if not sock:
        return (f"X-Bridge-Pane '{hint}' names no tmux server, so it is taken to be on the bridge's private server "
                f"'{socket_name}'; {what}. Send the header as the primary's pane knows itself — X-Bridge-Pane: "
                "$TMUX:$TMUX_PANE, run in that pane (or <tmux -L name>:<pane>) — or leave it out when the primary is "
                "not in tmux")
    return (f"X-Bridge-Pane '{hint}' is on the bridge's private tmux server '{socket_name}'; {what}. Run the primary "
            "in another tmux server, or correct the header (X-Bridge-Pane: $TMUX:$TMUX_PANE, run in the primary's "
            "pane)")


def tmux_server(socket):
    """The name of the tmux server ``socket`` names: a ``-L`` name as it is; a socket path — as a pane's own ``$TMUX``
    has it, ``<socket path>,<server pid>,<session index>`` (``/tmp/tmux-0/default,1234,0``) — by its last component,
    which is the name ``tmux -L <name>`` listens under (``$TMUX_TMPDIR/tmux-<uid>/<name>``)."""
    return re.sub(r",\d+,\d+$", "", socket).rpartition("/")[2]


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
