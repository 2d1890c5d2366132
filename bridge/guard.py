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

The IsolationGuard: a worker that runs a real agent does not run as the server's own OS user.

* **No agent with the server's powers.** A worker of any kind but the stand-in (``Profile.runs_commands``: Claude
  Code runs shell commands unattended) started as the server's own OS user could read var/ (the database, the KEK
  directory), ``/proc/<server pid>/environ`` and run manage.py — any Operator would be everything. Its spawn is
  refused with ``isolation_boundary`` unless the profile names another user (``run_as``), or the installation says
  it is a single-person workstation (``YUZU_BRIDGE_SAME_USER_WORKERS=1``, ``conf.same_user_workers``).
* **run_as is checked before anything exists**: the user exists, the server is root (only root may start a process
  as another user), and that user may enter the worker's working directory (default: its home). The launcher
  (bridge/launch.py) then drops to it — initgroups, setgid, setuid — after it has read and deleted the env file.
"""

import os
import pwd
import re
import subprocess
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


def server_euid():
    """The uid this server runs as (a function, so a test on a root machine can play an ordinary user's server)."""
    return os.geteuid()


class IsolationGuard:
    """The spawn check of run_as (see the module docstring)."""

    @staticmethod
    def check_spawn(profile, cwd):
        """``(user, cwd)`` a worker of ``profile`` starts with: ``user`` None for the server's own user, else the
        run_as name; ``cwd`` the profile's (substituted) cwd, else the repository root, or with run_as that user's
        home. Raises ``isolation_boundary`` with what an administrator can do."""
        name, euid = (profile.run_as or "").strip(), server_euid()
        pw = None
        if name:
            try:
                pw = pwd.getpwnam(name)
            except KeyError:
                raise BridgeFailure(
                    "isolation_boundary",
                    f"profile '{profile.name}' runs its worker as OS user '{name}', but there is no OS user of that "
                    f"name on the bridge's host; an administrator must create it (useradd --create-home {name}) or "
                    "correct run_as (admin → Bridge → Profiles)") from None
            if pw.pw_uid == euid:
                pw = None  # the server's own user by another name
            elif euid != 0:
                raise BridgeFailure(
                    "isolation_boundary",
                    f"profile '{profile.name}' runs its worker as OS user '{name}', but the server runs as uid "
                    f"{euid}, not root, and only root may start a process as another user; run the server (daphne "
                    "and the bridge poller) as root, or an administrator must clear run_as (admin → Bridge → "
                    "Profiles)")
        if pw is None:
            if profile.runs_commands and not conf.same_user_workers():
                raise BridgeFailure(
                    "isolation_boundary",
                    f"profile '{profile.name}' would run a {profile.get_agent_kind_display()} worker, which runs "
                    f"commands unattended, as the server's own OS user ({_user_name(euid)}): it could read the "
                    "server's database, keys and environment and run its management commands. An administrator "
                    "must set the profile's run_as to an unprivileged OS user (docs/bridge.md, Isolating workers), "
                    "or — on a single-person workstation whose operator owns the machine anyway — opt in with "
                    "YUZU_BRIDGE_SAME_USER_WORKERS=1")
            return None, cwd or conf.repo_root()
        cwd = cwd or pw.pw_dir
        if not _may_enter(pw, cwd):
            raise BridgeFailure(
                "isolation_boundary",
                f"profile '{profile.name}' runs its worker as OS user '{name}', who may not enter its working "
                f"directory {cwd!r} (or it is no directory); an administrator must set the profile's cwd to a "
                f"workspace that user owns (e.g. its home, {pw.pw_dir})")
        return name, cwd


def _user_name(uid):
    try:
        return f"'{pwd.getpwuid(uid).pw_name}'"
    except KeyError:
        return f"uid {uid}"


def _may_enter(pw, path):
    """Whether user ``pw`` may make ``path`` its working directory: asked of the kernel, as that user (only root
    gets here), so permissions, ACLs and every parent directory count as they will for the worker."""
    if not os.path.isdir(path):
        return False
    try:
        return subprocess.run(["/bin/sh", "-c", 'cd -- "$1"', "sh", path], user=pw.pw_uid, group=pw.pw_gid,
                              extra_groups=os.getgrouplist(pw.pw_name, pw.pw_gid), cwd="/",
                              env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


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
