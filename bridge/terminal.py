"""Terminal backend for the bridge (spec §8): panes the bridge owns.

Pure Python, no Django. ``TerminalBackend`` is the interface the bridge's
policy layer talks to; ``TmuxBackend`` implements it on a *private* tmux
server (``tmux -L <socket_name>``), so the bridge never touches a person's own
tmux sessions, while that person can still watch a worker with
``tmux -L <socket_name> attach -t <terminal_id>``.

Design notes
------------
* Every tmux call is a plain ``subprocess.run`` with an argument list (no
  shell) and a timeout; failures raise :class:`TerminalError`, and a pane (or
  the whole private server) that no longer exists raises
  :class:`PaneNotFound`.
* A pane runs ``python bridge/launch.py <env file> argv``: the program sees
  exactly the ``env`` it was given, never the tmux server's environment (nor
  the ``TMUX``/``TERM`` variables tmux adds), and the values travel in a 0600
  file the launcher deletes before it exec's the program — never on a command
  line (tmux keeps its first client's argv for the server's lifetime, readable
  by every user with ``ps``). Given a ``user``, the launcher (still the
  server's user, root) drops to that OS user after reading and deleting the
  file, before the exec.
* ``remain-on-exit`` is set globally on the private server *before* the pane is
  created (same tmux invocation), so even a program that exits at once leaves a
  dead pane behind: death is observable via :meth:`alive`.
* :meth:`TmuxBackend.paste` delivers text as ONE bracketed paste
  (``load-buffer`` from stdin into a uniquely named buffer, then
  ``paste-buffer -p -d``), then presses Enter. It refuses text holding a
  control character (:func:`unpasteable`): an ESC could end the bracketed
  paste early (``ESC[201~``) and have the rest typed as keystrokes.
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from yuzu.cpus import unpinned

__all__ = [
    "unpasteable",
    "PaneInfo",
    "PaneNotFound",
    "pane_target",
    "TerminalBackend",
    "TerminalError",
    "TmuxBackend",
]

class TerminalError(Exception):
    """A terminal-backend operation failed (tmux missing, error, timeout)."""


class PaneNotFound(TerminalError):
    """The pane, or the private tmux server holding it, does not exist."""


@dataclass(frozen=True)
class PaneInfo:
    """Identity of a pane the backend started.

    ``pane_id`` is the backend's pane handle (tmux ``%N``); ``terminal_id`` is
    the session that holds it (attach to it to watch); ``pid`` is the process
    running in the pane (``env`` exec's the program, so it is the program's pid).
    """

    pane_id: str
    terminal_id: str
    pid: int

    @property
    def target(self) -> str:
        return pane_target(self.terminal_id, self.pane_id)


def pane_target(terminal_id: str, pane_id: str) -> str:
    """How the bridge addresses the pane it started in session ``terminal_id``: ``=session:.%N``, which tmux
    resolves only while pane ``%N`` is in that very session. A bare ``%N`` is not enough to keep: tmux numbers
    panes afresh whenever its server starts again (a crash, ``kill-server``, the last session closing), so a
    pane id kept from before may by now name another worker's pane. Session names carry the worker's random
    session id and are never reused."""
    return f"={terminal_id}:.{pane_id}" if terminal_id else pane_id


class TerminalBackend(abc.ABC):
    """What the bridge needs from a terminal multiplexer."""

    @abc.abstractmethod
    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | os.PathLike[str] | None = None,
        *,
        user: str | None = None,
    ) -> PaneInfo:
        """Start ``argv`` detached in a new pane with exactly ``env`` (as OS user ``user``: needs root)."""

    @abc.abstractmethod
    def paste(self, pane_id: str, text: str, *, submit: bool = True) -> None:
        """Deliver ``text`` as one bracketed paste, then Enter if ``submit``."""

    @abc.abstractmethod
    def send_keys(self, pane_id: str, *keys: str, literal: bool = False) -> None:
        """Send key names (``"Enter"``, ``"Escape"``, ``"C-c"``) or literal text."""

    @abc.abstractmethod
    def read_screen(self, pane_id: str) -> str:
        """The visible screen as text."""

    @abc.abstractmethod
    def read_tail(self, pane_id: str, lines: int = 40) -> str:
        """The last ``lines`` lines (history included), trailing blanks stripped."""

    @abc.abstractmethod
    def title(self, pane_id: str) -> str:
        """The pane title (set by the program with an OSC 0/2 escape)."""

    @abc.abstractmethod
    def alive(self, pane_id: str) -> bool:
        """True if the pane exists and its program is still running."""

    @abc.abstractmethod
    def close(self, pane_id: str) -> None:
        """Kill the pane. Idempotent: closing a gone pane is not an error."""

    @abc.abstractmethod
    def list_panes(self) -> list[PaneInfo]:
        """All panes this backend's server holds (dead ones included)."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Tear down everything this backend owns. Idempotent."""


# tmux stderr fragments meaning "that pane / server is not there".
_NOT_FOUND = (
    "can't find pane",
    "can't find window",
    "can't find session",
    "no server running",
    "error connecting to",
    "server exited unexpectedly",
)
_PANE_FORMAT = "#{pane_id}\t#{session_name}\t#{pane_pid}"
# What text sent to a pane must never hold: the C0 controls except tab, LF and CR, DEL, and the C1 controls
# (8-bit CSI and friends). tmux's paste-buffer turns every LF into CR anyway, so CR can do nothing LF cannot.
_UNPASTEABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_SESSION_NAME_RE = re.compile(r"[^A-Za-z0-9_-]")
#: a pane: ``%N``, or ``=session:.%N`` (pane_target)
_TARGET_RE = re.compile(r"(?:=[A-Za-z0-9_-]+:\.)?(%\d+)")
_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch.py")


def unpasteable(text: str) -> str | None:
    """The first character of ``text`` a paste must not carry, described for an error message; None if none."""
    found = _UNPASTEABLE.search(text)
    if found is None:
        return None
    return f"control character U+{ord(found.group()):04X} at offset {found.start()}"


def _tmux_arg(arg: str) -> str:
    """Escape one argument for tmux's own command splitting.

    tmux treats an argument ending in ``;`` as a command separator (``;``
    alone, or ``foo;`` = ``foo`` then a new command). A trailing ``\\;`` is
    tmux's escape for a literal ``;``.
    """
    return arg[:-1] + "\\;" if arg.endswith(";") else arg


class TmuxBackend(TerminalBackend):
    """:class:`TerminalBackend` on a private tmux server (``tmux -L NAME``)."""

    def __init__(
        self,
        socket_name: str,
        *,
        tmux: str = "tmux",
        timeout: float = 10.0,
        width: int = 200,
        height: int = 50,
        history_limit: int = 10000,
        paste_enter_delay: float = 0.05,
    ) -> None:
        if not socket_name or "/" in socket_name:
            raise ValueError(f"a socket name is required and must not contain '/': {socket_name!r}")
        self.socket_name = socket_name
        self.tmux = tmux
        self.timeout = timeout
        self.width = width
        self.height = height
        self.history_limit = history_limit
        # A short pause between the paste and its Enter, so an app that
        # debounces paste handling sees them as two events.
        self.paste_enter_delay = paste_enter_delay
        self._own_env_dir: str | None = None  # see _env_dir

    def __repr__(self) -> str:
        return f"TmuxBackend(socket_name={self.socket_name!r})"

    # -- plumbing ------------------------------------------------------------

    def _client_env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Never let an enclosing tmux session redirect or confuse the client.
        env.pop("TMUX", None)
        env.pop("TMUX_PANE", None)
        return env

    def _run(
        self,
        *args: str,
        input: bytes | None = None,
        timeout: float | None = None,
        label: str | None = None,
    ) -> str:
        # -u: the client speaks UTF-8 (titles/screens hold ✳ and braille).
        # -f /dev/null: the user's ~/.tmux.conf never shapes our server.
        cmd = [self.tmux, "-u", "-L", self.socket_name, "-f", os.devnull, *args]
        label = label or f"tmux {args[0]}"
        try:
            with unpinned():  # the first call starts tmux's server, parent of every pane: not on a daphne's CPU
                proc = subprocess.run(
                    cmd,
                    input=input,
                    capture_output=True,
                    timeout=self.timeout if timeout is None else timeout,
                    env=self._client_env(),
                    stdin=None if input is not None else subprocess.DEVNULL,
                )
        except FileNotFoundError as exc:
            raise TerminalError(f"tmux executable not found: {self.tmux!r}") from exc
        except subprocess.TimeoutExpired as exc:
            raise TerminalError(f"{label} timed out after {exc.timeout}s") from exc
        except OSError as exc:
            raise TerminalError(f"cannot run tmux: {exc}") from exc
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip()
            msg = f"{label} failed (rc={proc.returncode}): {err or 'no message'}"
            if any(frag in err for frag in _NOT_FOUND):
                raise PaneNotFound(msg)
            raise TerminalError(msg)
        return proc.stdout.decode("utf-8", "replace")

    @staticmethod
    def _check_pane_id(pane_id: str) -> str:
        """A pane id (``%N``) or a pane_target; returns the pane id."""
        found = _TARGET_RE.fullmatch(pane_id) if isinstance(pane_id, str) else None
        if found is None:
            raise TerminalError(f"not a tmux pane id: {pane_id!r}")
        return found.group(1)

    @staticmethod
    def _parse_pane(line: str) -> PaneInfo:
        pane_id, session, pid = line.split("\t")
        return PaneInfo(pane_id=pane_id, terminal_id=session, pid=int(pid))

    # -- TerminalBackend -----------------------------------------------------

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | os.PathLike[str] | None = None,
        *,
        user: str | None = None,
    ) -> PaneInfo:
        argv = [str(a) for a in argv]
        if not argv:
            raise TerminalError("argv must not be empty")
        if "=" in argv[0]:
            raise TerminalError(f"argv[0] must not contain '=': {argv[0]!r}")
        for key, value in env.items():
            if not key or "=" in key or "\0" in key or "\0" in str(value):
                raise TerminalError(f"invalid environment variable name/value: {key!r}")
        session = _SESSION_NAME_RE.sub("_", name) or "pane"
        new_session = ["new-session", "-d", "-P", "-F", _PANE_FORMAT,
                       "-s", session, "-n", session,
                       "-x", str(self.width), "-y", str(self.height)]
        if cwd is not None:
            cwd = os.fspath(cwd)
            if not os.path.isdir(cwd):
                raise TerminalError(f"cwd is not a directory: {cwd!r}")
            new_session += ["-c", cwd.replace("#", "##")]  # tmux expands formats in -c: "#(cmd)" would run cmd
        try:  # a full or read-only temporary directory is the spawn's failure, not an internal error
            fd, env_file = tempfile.mkstemp(suffix=".json", dir=self._env_dir())  # 0600, unguessable name
        except OSError as exc:
            raise TerminalError(f"cannot create the launcher's environment file: {exc}") from exc
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({k: str(v) for k, v in env.items()}, f)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(env_file)
            raise TerminalError(f"cannot write the launcher's environment file: {exc}") from exc
        command = [sys.executable, _LAUNCHER, *(["--user", user] if user else []), env_file, *argv]
        new_session += [_tmux_arg(a) for a in command]
        # One invocation: start the server if needed, make dead panes stay,
        # then create the session -- no window in which a fast-exiting
        # program could take its pane with it.
        try:
            out = self._run(
                "start-server", ";",
                "set-option", "-g", "remain-on-exit", "on", ";",
                "set-option", "-g", "history-limit", str(self.history_limit), ";",
                *new_session,
                label=f"tmux new-session {session!r}",
            )
        except TerminalError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(env_file)  # the pane never started: its launcher will not remove it
            raise
        lines = [ln for ln in out.splitlines() if ln.strip()]
        if not lines:
            raise TerminalError(f"tmux new-session printed no pane for {session!r}")
        return self._parse_pane(lines[-1])

    def paste(self, pane_id: str, text: str, *, submit: bool = True) -> None:
        self._check_pane_id(pane_id)
        bad = unpasteable(text)
        if bad is not None:
            raise TerminalError(f"refusing to paste text holding a {bad}: only tab, newline and carriage return "
                                "may be pasted")
        if text:
            buffer = f"yuzu-{uuid.uuid4().hex}"
            self._run("load-buffer", "-b", buffer, "-", input=text.encode("utf-8"))
            try:
                # -p: bracketed paste (if the app enabled it); -d: delete buffer.
                self._run("paste-buffer", "-p", "-d", "-b", buffer, "-t", pane_id)
            except TerminalError:
                try:
                    self._run("delete-buffer", "-b", buffer)
                except TerminalError:
                    pass
                raise
        if submit:
            if text and self.paste_enter_delay > 0:
                time.sleep(self.paste_enter_delay)
            self._run("send-keys", "-t", pane_id, "Enter")

    def send_keys(self, pane_id: str, *keys: str, literal: bool = False) -> None:
        self._check_pane_id(pane_id)
        if not keys:
            return
        flags = ["-l"] if literal else []
        self._run("send-keys", *flags, "-t", pane_id, "--", *[_tmux_arg(k) for k in keys])

    def read_screen(self, pane_id: str) -> str:
        self._check_pane_id(pane_id)
        return self._run("capture-pane", "-p", "-t", pane_id)

    def read_tail(self, pane_id: str, lines: int = 40, *, join_wrapped: bool = False) -> str:
        self._check_pane_id(pane_id)
        if lines <= 0:
            return ""
        # From `lines` rows up in history through the whole visible screen:
        # after dropping trailing blank rows, the last `lines` rows are there.
        flags = ["-p", "-S", f"-{lines}", "-t", pane_id]
        if join_wrapped:
            flags.insert(0, "-J")
        rows = self._run("capture-pane", *flags).splitlines()
        while rows and not rows[-1].strip():
            rows.pop()
        return "\n".join(rows[-lines:])

    def _pane_format(self, pane_id: str, fmt: str) -> str:
        """Expand a format for one pane; PaneNotFound if it does not exist.

        (``display-message -t`` silently falls back to another pane when the
        target is gone, so ask ``list-panes`` for the pane's window and pick
        the pane's own row.)
        """
        wanted = self._check_pane_id(pane_id)
        out = self._run("list-panes", "-t", pane_id, "-F", "#{pane_id}\t" + fmt)
        for line in out.splitlines():
            pid, _, value = line.partition("\t")
            if pid == wanted:
                return value
        raise PaneNotFound(f"can't find pane: {pane_id}")

    def title(self, pane_id: str) -> str:
        return self._pane_format(pane_id, "#{pane_title}")

    def alive(self, pane_id: str) -> bool:
        try:
            return self._pane_format(pane_id, "#{pane_dead}").strip() == "0"
        except PaneNotFound:
            return False

    def exit_status(self, pane_id: str) -> int | None:
        """Exit status of a dead pane's program.

        None while it runs -- and after death until tmux has reaped the
        process (``pane_dead`` flips when the pty closes, the status arrives
        with SIGCHLD).
        """
        fmt = "#{pane_dead} #{pane_dead_status} #{pid}"
        for attempt in range(2):
            dead, status, server_pid = (self._pane_format(pane_id, fmt).split(" ") + ["", ""])[:3]
            if dead != "1":
                return None
            if status.lstrip("-").isdigit():
                return int(status)
            if attempt == 0 and server_pid.isdigit():
                # tmux built with libutempter can miss a SIGCHLD and leave the
                # pane's process a zombie with no status (tmux/tmux#311). A
                # SIGCHLD to our own private server makes it reap again.
                try:
                    os.kill(int(server_pid), signal.SIGCHLD)
                except OSError:
                    return None
                time.sleep(0.01)
        return None

    def close(self, pane_id: str) -> None:
        self._check_pane_id(pane_id)
        try:
            self._run("kill-pane", "-t", pane_id)
        except PaneNotFound:
            pass

    def list_panes(self) -> list[PaneInfo]:
        try:
            out = self._run("list-panes", "-a", "-F", _PANE_FORMAT)
        except PaneNotFound:  # no server: no panes
            return []
        return [self._parse_pane(ln) for ln in out.splitlines() if ln.strip()]

    @property
    def socket_path(self) -> str:
        """Where tmux puts ``-L <socket_name>`` (``$TMUX_TMPDIR`` or /tmp)."""
        tmpdir = os.environ.get("TMUX_TMPDIR") or "/tmp"
        return os.path.join(os.path.realpath(tmpdir), f"tmux-{os.getuid()}", self.socket_name)

    def _shared_env_dir(self) -> str:
        return os.path.join(tempfile.gettempdir(), f"yuzu-bridge-env-{os.getuid()}-{self.socket_name}")

    def _env_dir(self) -> str:
        """This server's private directory for launcher env files (0700, ours), swept of any file a
        launcher never got to (a pane killed before it ran) once it is a minute old.

        Its name is predictable, in the shared temporary directory: when another user got there first (their
        directory, one that lets others in, a symlink), no secret goes there, and no spawn is refused for it
        either — this backend makes a private directory of its own with an unguessable name instead."""
        path = self._own_env_dir or self._shared_env_dir()
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            st = os.lstat(path)
            private = stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not stat.S_IMODE(st.st_mode) & 0o077
        except OSError:  # e.g. a squatter's file or symlink by that name
            private = False
        if not private:
            if path == self._own_env_dir:
                raise TerminalError(f"{path} is no longer a private directory of this user; refusing to write "
                                    "secrets there")
            path = self._own_env_dir = tempfile.mkdtemp(prefix=f"yuzu-bridge-env-{self.socket_name}-")
        for entry in os.scandir(path):
            with contextlib.suppress(OSError):
                if time.time() - entry.stat().st_mtime > 60:
                    os.unlink(entry.path)
        return path

    def shutdown(self) -> None:
        try:
            self._run("kill-server")
        except PaneNotFound:
            pass
        for path in (self._shared_env_dir(), self._own_env_dir):
            if path is not None:
                with contextlib.suppress(OSError):
                    st = os.lstat(path)
                    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():  # never a squatter's
                        shutil.rmtree(path, ignore_errors=True)
        # tmux leaves the socket file behind; remove ours (only if a socket).
        try:
            if stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                os.unlink(self.socket_path)
        except OSError:
            pass
