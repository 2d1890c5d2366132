"""The bridge's terminal layer against REAL tmux (spec §8).

Covers ``bridge.terminal.TmuxBackend`` (private socket, exact env, one
bracketed paste, screen/tail/title, death, idempotent close) and the stand-in
agent ``python -m bridge.testing.standin`` talking to a fake MCP endpoint.
No Django needed. Every wait is a bounded poll.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bridge.status import AgentStatus, classify, status_from_title
from bridge.terminal import (
    PaneNotFound,
    TerminalError,
    TmuxBackend,
)
from yuzu.testing import wait_until

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None,
    reason="tmux is not installed (Debian package 'tmux'); these tests drive real tmux panes",
)

REPO_ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
BASE_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def backend():
    b = TmuxBackend(unique(f"yuzu-test-{os.getpid()}"), width=100, height=20)
    yield b
    b.shutdown()


def default_server_sessions():
    """Session names on the user's DEFAULT tmux server (None if no server)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}
    proc = subprocess.run(
        ["tmux", "ls", "-F", "#{session_name}"], capture_output=True, text=True, env=env, timeout=10
    )
    return sorted(proc.stdout.split()) if proc.returncode == 0 else None


# -- backend -------------------------------------------------------------------


def test_socket_name_is_explicit():
    """No default server: the bridge names its own, one per installation (bridge.conf.socket_name, tested in
    tests/bridge/test_bridge_first_contact.py), so no code path can fall back to a name another installation shares."""
    assert TmuxBackend("explicit").socket_name == "explicit"
    with pytest.raises(TypeError):
        TmuxBackend()
    for bad in ("", "a/b"):
        with pytest.raises(ValueError):
            TmuxBackend(bad)


def test_env_is_exactly_what_was_passed(monkeypatch, tmp_path):
    # The marker is in this process's env, hence in the tmux client's and the
    # (fresh) server's env -- it must still not reach the pane.
    monkeypatch.setenv("YUZU_LEAK_MARKER", "leaked")
    b = TmuxBackend(unique("yuzu-test-env"))
    try:
        out = tmp_path / "env.json"
        program = "import json,os,sys; json.dump({'env': dict(os.environ), 'cwd': os.getcwd()}, open(sys.argv[1], 'w'))"
        given = {**BASE_ENV, "YUZU_GIVEN": "yes; with $HOME and spaces", "EMPTY": ""}
        pane = b.start("env-check", [PY, "-c", program, str(out)], given, cwd=tmp_path)
        assert pane.pane_id.startswith("%") and pane.terminal_id == "env-check" and pane.pid > 0
        wait_until(lambda: out.exists() and out.stat().st_size > 0, what="env dump")
        wait_until(lambda: not b.alive(pane.pane_id), what="program exit")
        seen = json.loads(out.read_text())
        assert seen["env"] == given  # exactly: no marker, no TMUX/TMUX_PANE/TERM
        assert Path(seen["cwd"]).resolve() == tmp_path.resolve()
        assert os.path.exists(b.socket_path)
    finally:
        b.shutdown()
    assert not os.path.exists(b.socket_path)  # shutdown removes the private socket
    assert b.list_panes() == []
    b.shutdown()  # idempotent


def test_argv_is_passed_verbatim(backend, tmp_path):
    out = tmp_path / "argv.json"
    args = ["a;", ";", "b\\;", "#{pane_id}", "$HOME", "-x", "✳ ⠋", "two words"]
    program = "import json,sys; json.dump(sys.argv[2:], open(sys.argv[1], 'w'))"
    backend.start(unique("argv"), [PY, "-c", program, str(out), *args], BASE_ENV)
    wait_until(lambda: out.exists() and out.stat().st_size > 0, what="argv dump")
    assert json.loads(out.read_text()) == args


READER = textwrap.dedent(
    r"""
    import json, os, sys, tty
    tty.setcbreak(0)
    os.write(1, b"\x1b[?2004hREADY\n")  # enable bracketed paste
    chunks, buf = [], b""
    while not (b"\x1b[201~" in buf and buf.endswith((b"\n", b"\r"))):
        chunk = os.read(0, 65536)
        if not chunk:
            break
        chunks.append(chunk)
        buf += chunk
    with open(sys.argv[1] + ".tmp", "w") as f:
        json.dump([c.decode("utf-8", "replace") for c in chunks], f)
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    """
)


def test_multiline_paste_arrives_as_one_bracketed_read(backend, tmp_path):
    out = tmp_path / "paste.json"
    pane = backend.start(unique("paste"), [PY, "-c", READER, str(out)], BASE_ENV)
    wait_until(lambda: "READY" in backend.read_screen(pane.pane_id), what="reader ready")
    text = "first line\nsecond line; with semicolon\n  third ✳ line"
    backend.paste(pane.pane_id, text)
    wait_until(out.exists, what="reader result")
    chunks = json.loads(out.read_text())
    pasted = [c for c in chunks if "\x1b[200~" in c]
    assert len(pasted) == 1, chunks
    start = pasted[0].index("\x1b[200~") + len("\x1b[200~")
    end = pasted[0].index("\x1b[201~")  # same read as the start marker
    body = pasted[0][start:end].replace("\r", "\n")
    assert body == text
    tail = "".join(chunks).split("\x1b[201~", 1)[1]
    assert tail in ("\n", "\r")  # then exactly one Enter
    assert backend.list_panes()  # buffer deleted, server fine
    listing = subprocess.run(
        ["tmux", "-L", backend.socket_name, "list-buffers"], capture_output=True, text=True, timeout=10
    )
    assert "yuzu-" not in listing.stdout  # paste-buffer -d removed the named buffer


def test_control_characters_never_reach_the_pane(backend, tmp_path):
    """An ESC[201~ inside the text would end the bracketed paste early; what follows (here Shift-Tab, "2",
    Enter) would reach the program as keystrokes. paste refuses any such text; plain text still arrives as
    ONE paste that only its own end marker closes."""
    out = tmp_path / "paste.json"
    pane = backend.start(unique("escape"), [PY, "-c", READER, str(out)], BASE_ENV)
    wait_until(lambda: "READY" in backend.read_screen(pane.pane_id), what="reader ready")
    with pytest.raises(TerminalError, match=r"U\+001B at offset 8"):
        backend.paste(pane.pane_id, "harmless\x1b[201~\x1b[Z2\r")
    for ch in ("\x00", "\x03", "\x07", "\x08", "\x0b", "\x1b", "\x7f", "\x84", "\x9b"):  # C0, DEL, C1
        with pytest.raises(TerminalError, match=f"U\\+{ord(ch):04X} at offset 1"):
            backend.paste(pane.pane_id, f"a{ch}b", submit=False)
    text = "col 1\tcol 2\nthe literal text [201~ stays text ✳"
    backend.paste(pane.pane_id, text)
    wait_until(out.exists, what="reader result")
    received = "".join(json.loads(out.read_text()))
    assert received.count("\x1b[200~") == 1 and received.count("\x1b[201~") == 1, received
    start = received.index("\x1b[200~") + len("\x1b[200~")
    assert received[start:received.index("\x1b[201~")].replace("\r", "\n") == text
    assert "harmless" not in received and "\x1b[Z" not in received  # nothing of the refused text arrived


SCREEN_PROGRAM = textwrap.dedent(
    r"""
    import sys
    for i in range(1, 121):
        print(f"line {i:03d}")
    sys.stdout.write("\x1b]2;my pane title\x07")
    sys.stdout.flush()
    got = input()
    print(f"got {got!r}")
    sys.exit(3)
    """
)


def test_screen_tail_title_death_and_close(backend):
    pane = backend.start(unique("screen"), [PY, "-c", SCREEN_PROGRAM], BASE_ENV)
    wait_until(lambda: backend.title(pane.pane_id) == "my pane title", what="title")
    assert backend.alive(pane.pane_id)
    assert any(p.pane_id == pane.pane_id for p in backend.list_panes())

    screen = backend.read_screen(pane.pane_id)
    rows = screen.splitlines()
    assert len(rows) == 20  # the visible screen only
    # 19 printed lines plus the cursor's empty row: the top 101 lines scrolled off.
    assert rows[0] == "line 102" and rows[18] == "line 120" and rows[19] == ""

    tail = backend.read_tail(pane.pane_id, lines=30)  # reaches into history
    assert tail.splitlines() == [f"line {i:03d}" for i in range(91, 121)]
    assert backend.read_tail(pane.pane_id, lines=3) == "line 118\nline 119\nline 120"

    backend.send_keys(pane.pane_id, "hi;", literal=True)
    backend.send_keys(pane.pane_id, "Enter")
    wait_until(lambda: not backend.alive(pane.pane_id), what="pane death")
    wait_until(lambda: backend.exit_status(pane.pane_id) is not None, what="exit status")
    assert backend.exit_status(pane.pane_id) == 3
    assert "got 'hi;'" in backend.read_tail(pane.pane_id, 5)  # dead pane still readable

    backend.close(pane.pane_id)
    backend.close(pane.pane_id)  # idempotent
    assert not backend.alive(pane.pane_id)
    assert all(p.pane_id != pane.pane_id for p in backend.list_panes())
    with pytest.raises(PaneNotFound):
        backend.title(pane.pane_id)


def test_fast_exit_still_leaves_an_observable_dead_pane(backend):
    pane = backend.start(unique("fast"), ["/bin/sh", "-c", "echo bye; exit 7"], BASE_ENV)
    wait_until(lambda: not backend.alive(pane.pane_id), what="pane death")
    wait_until(lambda: backend.exit_status(pane.pane_id) is not None, what="exit status")
    assert backend.exit_status(pane.pane_id) == 7
    assert "bye" in backend.read_tail(pane.pane_id)
    backend.close(pane.pane_id)


def test_errors_are_terminal_errors(backend, tmp_path):
    with pytest.raises(TerminalError):
        backend.start(unique("x"), [], BASE_ENV)
    with pytest.raises(TerminalError):
        backend.start(unique("x"), ["/bin/true"], {"BAD=NAME": "1"})
    with pytest.raises(TerminalError):
        backend.start(unique("x"), ["/bin/true"], BASE_ENV, cwd=tmp_path / "missing")
    with pytest.raises(TerminalError):
        backend.read_screen("not-a-pane")
    name = unique("dup")
    pane = backend.start(name, ["/bin/sh", "-c", "sleep 30"], BASE_ENV)
    with pytest.raises(TerminalError, match="duplicate session"):
        backend.start(name, ["/bin/true"], BASE_ENV)
    backend.close(pane.pane_id)
    missing = TmuxBackend(unique("yuzu-test-noserver"))
    assert missing.list_panes() == []
    assert missing.alive("%0") is False
    missing.close("%0")
    missing.shutdown()
    with pytest.raises(PaneNotFound):
        missing.read_screen("%0")
    with pytest.raises(TerminalError, match="not found"):
        TmuxBackend(unique("x"), tmux="/nonexistent/tmux").list_panes()


def test_a_working_directory_is_a_path_not_a_tmux_format(backend, tmp_path):
    """tmux expands formats in new-session's -c: a directory named "#(cmd)" ran cmd (as the tmux server), and
    the pane, its expanded path being no directory, started in the server's own."""
    cwd = tmp_path / "proj #(echo ran) #{pane_id}"
    cwd.mkdir()
    pane = backend.start(unique("cwd"), ["/bin/sh", "-c", "pwd; sleep 30"], BASE_ENV, cwd=cwd)
    try:
        wait_until(lambda: "proj" in backend.read_screen(pane.pane_id), what="the pane's pwd")
        assert backend.read_screen(pane.pane_id).splitlines()[0] == str(cwd)
    finally:
        backend.close(pane.pane_id)


def test_a_target_names_its_pane_only_inside_its_session(backend):
    a = backend.start(unique("bridge-a"), ["/bin/sh", "-c", "sleep 30"], BASE_ENV)
    b = backend.start(unique("bridge-b"), ["/bin/sh", "-c", "sleep 30"], BASE_ENV)
    try:
        assert backend.alive(a.target) and backend.title(a.target) == backend.title(a.pane_id)
        crossed = f"={b.terminal_id}:.{a.pane_id}"  # a's pane id, b's session
        assert not backend.alive(crossed)
        for op in (backend.read_screen, backend.title, lambda t: backend.send_keys(t, "x"),
                   lambda t: backend.paste(t, "x")):
            with pytest.raises(PaneNotFound):
                op(crossed)
        backend.close(crossed)
        assert backend.alive(a.pane_id) and backend.alive(b.pane_id)
        with pytest.raises(TerminalError):
            backend.read_screen("=a b:.%1")  # a session name the bridge never makes
    finally:
        backend.close(a.target)
        backend.close(b.target)
        assert not backend.alive(a.pane_id) and not backend.alive(b.pane_id)


def test_private_socket_does_not_touch_default_server(backend):
    before = default_server_sessions()
    name = unique("private")
    pane = backend.start(name, ["/bin/sh", "-c", "sleep 30"], BASE_ENV)
    try:
        after = default_server_sessions()
        assert after == before
        assert name not in (after or [])
        socket_path = subprocess.run(
            ["tmux", "-L", backend.socket_name, "display-message", "-p", "-t", pane.pane_id, "#{socket_path}"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()
        assert socket_path == backend.socket_path
        assert os.path.basename(socket_path) == backend.socket_name
        private = subprocess.run(
            ["tmux", "-L", backend.socket_name, "ls", "-F", "#{session_name}"],
            capture_output=True, text=True, timeout=10,
        ).stdout.split()
        assert name in private
    finally:
        backend.close(pane.pane_id)


# -- stand-in agent against a fake MCP endpoint -----------------------------------


class FakeBridge:
    """A stdlib HTTP server faking the bridge's MCP endpoint."""

    SESSION = "fake-session-1"

    def __init__(self):
        self.messages = []  # (json-rpc message, headers)
        self.calls = []  # (tool name, arguments, headers)
        self.ask_result = {"answer": "a.yaml"}
        self.cond = threading.Condition()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                headers = {k.lower(): v for k, v in self.headers.items()}
                fake.record(body, headers)
                if "id" not in body:  # notification
                    self.send_response(202)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                extra = {}
                if body["method"] == "initialize":
                    result = {
                        "protocolVersion": body["params"]["protocolVersion"],
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "fake-bridge", "version": "0"},
                    }
                    extra["Mcp-Session-Id"] = FakeBridge.SESSION
                else:
                    name = body["params"]["name"]
                    structured = (
                        {"delivered": True, "mode": "resolved"} if name == "bridge_reply" else fake.ask_result
                    )
                    result = {
                        "structuredContent": structured,
                        "content": [{"type": "text", "text": json.dumps(structured)}],
                    }
                data = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}/mcp/bridge/"

    def record(self, body, headers):
        with self.cond:
            self.messages.append((body, headers))
            if body.get("method") == "tools/call":
                self.calls.append((body["params"]["name"], body["params"]["arguments"], headers))
            self.cond.notify_all()

    def wait_calls(self, n, timeout=5.0):
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.calls) >= n, timeout):
                raise AssertionError(f"expected {n} tool calls, got {self.calls!r}")
            return list(self.calls)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_bridge():
    fake = FakeBridge()
    yield fake
    fake.close()


@pytest.fixture
def standin(backend, fake_bridge):
    env = {
        **BASE_ENV,
        "YUZU_BRIDGE_URL": fake_bridge.url,
        "YUZU_BRIDGE_TOKEN": "tok-standin",
        "YUZU_STANDIN_BUSY_SECONDS": "0.05",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    pane = backend.start(unique("standin"), [PY, "-m", "bridge.testing.standin"], env, cwd=REPO_ROOT)
    wait_until(lambda: is_idle(backend, pane.pane_id), what="stand-in idle")
    yield pane
    backend.close(pane.pane_id)


def is_idle(backend, pane_id):
    return backend.title(pane_id) == "✳ standin" and backend.read_screen(pane_id).rstrip().endswith(">")


def test_standin_reply(backend, fake_bridge, standin):
    assert classify(backend.title(standin.pane_id), backend.read_screen(standin.pane_id)) is AgentStatus.IDLE
    backend.paste(standin.pane_id, "reply:hello")
    calls = fake_bridge.wait_calls(1)
    name, args, headers = calls[0]
    assert (name, args) == ("bridge_reply", {"content": "hello"})
    assert headers["authorization"] == "Bearer tok-standin"
    assert headers["mcp-session-id"] == FakeBridge.SESSION
    assert headers["mcp-protocol-version"] == "2025-11-25"
    assert "text/event-stream" in headers["accept"] and "application/json" in headers["accept"]
    methods = [m.get("method") for m, _ in fake_bridge.messages]
    assert methods[:3] == ["initialize", "notifications/initialized", "tools/call"]
    assert fake_bridge.messages[0][0]["params"]["protocolVersion"] == "2025-11-25"
    wait_until(lambda: is_idle(backend, standin.pane_id), what="idle after reply")
    assert "delivered" in backend.read_tail(standin.pane_id, 5)


def test_standin_ask_then_reply_with_answer(backend, fake_bridge, standin):
    backend.paste(standin.pane_id, "ask:which?")
    calls = fake_bridge.wait_calls(2)
    assert [(c[0], c[1]) for c in calls] == [
        ("bridge_ask", {"content": "which?"}),
        ("bridge_reply", {"content": "answered:a.yaml"}),
    ]
    wait_until(lambda: is_idle(backend, standin.pane_id), what="idle after ask")


def test_standin_multiline_message_is_one_turn(backend, fake_bridge, standin):
    backend.paste(standin.pane_id, "first line of the task\nsecond line: details")
    calls = fake_bridge.wait_calls(1)
    assert (calls[0][0], calls[0][1]) == (
        "bridge_reply",
        {"content": "echo:first line of the task\nsecond line: details"},
    )
    wait_until(lambda: is_idle(backend, standin.pane_id), what="idle after echo")
    time.sleep(0.2)  # a second turn would show up as a second call
    assert len(fake_bridge.calls) == 1


def test_standin_done_ends_turn_without_reply(backend, fake_bridge, standin):
    backend.paste(standin.pane_id, "done")
    wait_until(lambda: "turn done (no reply)" in backend.read_tail(standin.pane_id, 5), what="turn end")
    wait_until(lambda: is_idle(backend, standin.pane_id), what="idle after done")
    assert fake_bridge.calls == []


def test_standin_titles_idle_and_stalled(backend, fake_bridge, standin):
    assert backend.title(standin.pane_id) == "✳ standin"
    backend.paste(standin.pane_id, "stall")
    title = wait_until(
        lambda: (t := backend.title(standin.pane_id)) and 0x2800 <= ord(t[0]) <= 0x28FF and t,
        what="braille spinner title",
    )
    assert status_from_title(title) is AgentStatus.WORKING
    screen = wait_until(
        lambda: (s := backend.read_screen(standin.pane_id)) and "esc to interrupt" in s and s,
        what="busy line",
    )
    assert classify(None, screen) is AgentStatus.WORKING  # screen rules alone agree
    # Stalled: a second message is not picked up, the spinner keeps going.
    backend.paste(standin.pane_id, "reply:should not happen")
    frames = {backend.title(standin.pane_id)}
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:
        frames.add(backend.title(standin.pane_id))
        time.sleep(0.05)
    assert len(frames) > 1 and all(0x2800 <= ord(f[0]) <= 0x28FF for f in frames)
    assert fake_bridge.calls == []
    assert backend.alive(standin.pane_id)


def test_standin_exit_kills_the_pane(backend, fake_bridge, standin):
    backend.paste(standin.pane_id, "exit")
    wait_until(lambda: not backend.alive(standin.pane_id), what="stand-in exit")
    wait_until(lambda: backend.exit_status(standin.pane_id) is not None, what="exit status")
    assert backend.exit_status(standin.pane_id) == 0
    assert fake_bridge.calls == []


def test_a_workers_secrets_never_appear_on_a_command_line(tmp_path):
    """tmux keeps its first client's argv as the server's own for the server's lifetime, and every user can
    read it (ps, /proc/<pid>/cmdline): the worker's token used to sit there as `env -i … YUZU_BRIDGE_TOKEN=…`."""
    import psutil

    secret = "yuzu_" + "5ec2e7" * 10 + "abcd"
    b = TmuxBackend(unique("yuzu-test-secret"))
    try:
        out = tmp_path / "seen.txt"
        program = "import os,sys; open(sys.argv[1], 'w').write(os.environ['YUZU_BRIDGE_TOKEN'])"
        pane = b.start("secret-check", [PY, "-c", program, str(out)], {**BASE_ENV, "YUZU_BRIDGE_TOKEN": secret})
        wait_until(lambda: out.exists() and out.stat().st_size > 0, what="the worker to read its token")
        assert out.read_text() == secret  # the worker got it …
        cmdlines = []
        for proc in psutil.process_iter(["cmdline"]):
            cmdlines.append(" ".join(proc.info["cmdline"] or []))
        assert not [c for c in cmdlines if secret in c]  # … and no process shows it
        assert any(b.socket_name in c for c in cmdlines)  # (the tmux server is there to be looked at)
        env_dir = Path(tempfile.gettempdir()) / f"yuzu-bridge-env-{os.getuid()}-{b.socket_name}"
        assert env_dir.is_dir() and oct(env_dir.stat().st_mode & 0o777) == "0o700"
        assert list(env_dir.iterdir()) == []  # the launcher removed the env file before running the program
        assert pane.pid > 0
    finally:
        b.shutdown()
    assert not env_dir.exists()


@pytest.mark.parametrize("squat", ["another user's", "open to others"])
def test_a_squatted_env_directory_neither_stops_spawns_nor_gets_the_token(tmp_path, squat):
    """The launcher's env directory has a predictable name in the shared temporary directory. Another user of the
    host may create it first (their own, or one that lets them in): the bridge must not write a token there — and
    must not refuse every spawn for good either, which is what it did."""
    secret = "yuzu_" + "5ec2e7" * 10 + "abcd"
    b = TmuxBackend(unique("yuzu-test-squat"))
    squatted = Path(tempfile.gettempdir()) / f"yuzu-bridge-env-{os.getuid()}-{b.socket_name}"
    squatted.mkdir(mode=0o700)
    if squat == "another user's":
        if os.geteuid() != 0:
            pytest.skip("only root can hand a directory to another user")
        os.chown(squatted, 65534, 65534)
    else:
        os.chmod(squatted, 0o777)
    try:
        out = tmp_path / "seen.txt"
        program = "import os,sys; open(sys.argv[1], 'w').write(os.environ['YUZU_BRIDGE_TOKEN'])"
        b.start("squat-check", [PY, "-c", program, str(out)], {**BASE_ENV, "YUZU_BRIDGE_TOKEN": secret})
        wait_until(lambda: out.exists() and out.stat().st_size > 0, what="the worker to read its token")
        assert out.read_text() == secret
        assert list(squatted.iterdir()) == []  # nothing was ever written to the squatter's directory
    finally:
        b.shutdown()
        shutil.rmtree(squatted, ignore_errors=True)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs a process allowed on two CPUs or more")
def test_a_tmux_server_a_pinned_daphne_starts_and_its_panes_run_on_every_cpu_serve_had(monkeypatch):
    """serve pins each daphne to one CPU (yuzu.cpus); the worker sessions it starts in panes must not be."""
    from yuzu.cpus import ENV, affinity

    whole = os.sched_getaffinity(0)
    monkeypatch.setenv(ENV, ",".join(map(str, sorted(whole))))
    b = TmuxBackend(unique(f"yuzu-test-pin-{os.getpid()}"), width=80, height=20)
    try:
        with affinity({min(whole)}):  # a daphne's worker thread: its first tmux call starts the server
            pane = b.start("pinned", ["sleep", "30"], BASE_ENV)
        server = int(b._run("display-message", "-p", "-t", pane.pane_id, "#{pid}").strip())
        assert os.sched_getaffinity(server) == whole
        assert os.sched_getaffinity(pane.pid) == whole
    finally:
        b.shutdown()
