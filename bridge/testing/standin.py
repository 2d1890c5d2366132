"""Stand-in agent: a scripted "coding agent" for real tmux panes (spec §8).

Run as ``python -m bridge.testing.standin`` inside a terminal. It

* draws a prompt ``> `` and sets the title ``✳ standin`` when idle;
* while busy, cycles a braille spinner in the title and shows a status line
  containing ``esc to interrupt`` (like Claude Code), erased when done;
* reads one message per turn -- typed text ended by Enter, where a bracketed
  paste (ESC[200~ ... ESC[201~) counts as text, newlines and all, so a
  multi-line paste is ONE message;
* acts on the message:

  ``reply:<text>``   -> bridge_reply(content=<text>)
  ``ask:<question>`` -> bridge_ask(content=<question>), then
                        bridge_reply("answered:<answer>") -- after <s> seconds
                        when the answer reads ``wait:<s>:…``
  ``slow:<s>:<msg>`` -> stay busy <s> seconds, then act on <msg>
  ``done``           -> end the turn without replying
  ``stall``          -> stay busy forever, reading nothing more
  ``exit``           -> exit the process (the pane dies)
  anything else      -> bridge_reply("echo:<the full message>")

It talks to the bridge over MCP Streamable HTTP with plain ``urllib``:
``YUZU_BRIDGE_URL`` (e.g. http://127.0.0.1:8000/mcp/bridge/) and
``YUZU_BRIDGE_TOKEN`` (sent as ``Authorization: Bearer <token>``).
``YUZU_STANDIN_BUSY_SECONDS`` (default 0.3) is the least time a turn shows
busy, so a status poller can observe the pickup.
"""

from __future__ import annotations

import json
import os
import re
import sys
import termios
import threading
import time
import tty
import urllib.error
import urllib.request
from urllib.parse import urlsplit

PROTOCOL_VERSION = "2025-11-25"
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
IDLE_TITLE = "✳ standin"
PASTE_START = b"\x1b[200~"
PASTE_END = b"\x1b[201~"
REPLY_TIMEOUT = 60.0
ASK_TIMEOUT = 15 * 60.0  # bridge_ask blocks until the primary answers


# -- MCP over Streamable HTTP ------------------------------------------------


class BridgeError(Exception):
    pass


class BridgeClient:
    """Just enough of an MCP client: initialize, initialized, tools/call."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url
        self.token = token
        self.session_id: str | None = None
        self.protocol_version: str | None = None
        self._next_id = 0
        host = urlsplit(url).hostname or ""
        # The bridge is local; never route loopback calls through a proxy.
        handlers = [urllib.request.ProxyHandler({})] if host in ("127.0.0.1", "localhost", "::1") else []
        self._opener = urllib.request.build_opener(*handlers)

    def _post(self, message: dict, timeout: float) -> dict | None:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.session_id:
            headers["Mcp-Session-Id"] = self.session_id
        if self.protocol_version:
            headers["MCP-Protocol-Version"] = self.protocol_version
        request = urllib.request.Request(
            self.url, data=json.dumps(message).encode("utf-8"), headers=headers, method="POST"
        )
        with self._opener.open(request, timeout=timeout) as response:
            if message.get("method") == "initialize":
                self.session_id = response.headers.get("Mcp-Session-Id")
            body = response.read().decode("utf-8")
            content_type = response.headers.get("Content-Type", "")
        if "id" not in message:  # a notification: 202, no body
            return None
        reply = _pick_response(body, content_type, message["id"])
        if "error" in reply:
            raise BridgeError(f"{message.get('method')}: {reply['error']}")
        return reply.get("result", {})

    def _request(self, method: str, params: dict, timeout: float) -> dict:
        self._next_id += 1
        # a request (it has an id) always has a reply
        return self._post({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}, timeout) or {}

    def _initialize(self) -> None:
        self.session_id = self.protocol_version = None
        result = self._request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "yuzu-standin", "version": "1"},
            },
            REPLY_TIMEOUT,
        )
        self.protocol_version = result.get("protocolVersion") or PROTOCOL_VERSION
        self._post({"jsonrpc": "2.0", "method": "notifications/initialized"}, REPLY_TIMEOUT)

    def call_tool(self, name: str, arguments: dict, timeout: float = REPLY_TIMEOUT) -> dict:
        if self.protocol_version is None:
            self._initialize()
        params = {"name": name, "arguments": arguments}
        try:
            result = self._request("tools/call", params, timeout)
        except urllib.error.HTTPError as exc:
            if exc.code != 404 or not self.session_id:
                raise
            self._initialize()  # session expired: start a new one, retry once
            result = self._request("tools/call", params, timeout)
        structured = result.get("structuredContent")
        if structured is None:  # fall back to a JSON text block
            for block in result.get("content") or []:
                if block.get("type") == "text":
                    try:
                        structured = json.loads(block["text"])
                    except (ValueError, KeyError):
                        structured = {"text": block.get("text")}
                    break
        if result.get("isError"):
            raise BridgeError(f"{name} failed: {json.dumps(structured if structured is not None else result)}")
        return structured or {}


def _pick_response(body: str, content_type: str, request_id: int) -> dict:
    """The JSON-RPC response for ``request_id`` from a JSON or SSE body."""
    if "text/event-stream" not in content_type:
        return json.loads(body)
    data: list[str] = []
    for line in body.splitlines() + [""]:
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
        elif not line and data:
            event = json.loads("\n".join(data))
            data = []
            if isinstance(event, dict) and event.get("id") == request_id:
                return event
    raise BridgeError(f"no response for request {request_id} in event stream")


# -- terminal UI -------------------------------------------------------------


def osc_title(text: str) -> str:
    """The escape sequence that sets the terminal (tmux pane) title."""
    return f"\033]0;{text}\007"


class UI:
    """Writes to the terminal; a lock keeps the spinner thread's writes whole."""

    def __init__(self, fd: int = 1) -> None:
        self.fd = fd
        self.lock = threading.Lock()

    def write(self, text: str) -> None:
        self.write_bytes(text.encode("utf-8"))

    def write_bytes(self, data: bytes) -> None:
        with self.lock:
            os.write(self.fd, data)

    def say(self, line: str) -> None:
        """Print a line, erasing whatever the cursor's line held."""
        self.write("\r\033[2K" + line + "\n")

    def idle(self) -> None:
        self.write(osc_title(IDLE_TITLE) + "\r\033[2K> ")


class Busy:
    """While active: spinner title plus an 'esc to interrupt' status line."""

    def __init__(self, ui: UI) -> None:
        self.ui = ui
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        frame = 0
        while True:
            c = SPINNER[frame % len(SPINNER)]
            self.ui.write(osc_title(f"{c} standin") + f"\r\033[2K{c} Working… (esc to interrupt)")
            frame += 1
            if self._stop.wait(0.1):
                return

    def __enter__(self) -> Busy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.ui.write("\r\033[2K")  # the busy line goes away with the turn


class InputReader:
    """Reads one submitted message at a time from a cbreak-mode tty."""

    _ESCAPE_SEQ = re.compile(rb"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|O.|.)", re.DOTALL)

    def __init__(self, fd: int, ui: UI) -> None:
        self.fd = fd
        self.ui = ui
        self.pending = b""

    def _fill(self) -> bool:
        chunk = os.read(self.fd, 4096)
        self.pending += chunk
        return bool(chunk)

    def read_message(self) -> str | None:
        """The next message (None at end of input)."""
        data = bytearray()
        in_paste = False
        while True:
            if not self.pending and not self._fill():
                return None
            if in_paste:
                end = self.pending.find(PASTE_END)
                if end < 0:
                    # Keep a possible partial end marker for the next read.
                    safe = max(0, len(self.pending) - (len(PASTE_END) - 1))
                    data += self.pending[:safe]
                    self.pending = self.pending[safe:]
                    if not self._fill():
                        return None
                    continue
                pasted = self.pending[:end]
                data += pasted
                self.pending = self.pending[end + len(PASTE_END):]
                in_paste = False
                self._echo_paste(pasted)
                continue
            if self.pending.startswith(b"\x1b"):
                if PASTE_START.startswith(self.pending):  # partial marker
                    if not self._fill():
                        return None
                    continue
                if self.pending.startswith(PASTE_START):
                    self.pending = self.pending[len(PASTE_START):]
                    in_paste = True
                    continue
                m = self._ESCAPE_SEQ.match(self.pending)  # other keys: ignore
                self.pending = self.pending[m.end() if m else 1:]
                continue
            byte, self.pending = self.pending[0], self.pending[1:]
            if byte in (0x0A, 0x0D):  # Enter
                text = data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
                if text.strip():
                    self.ui.write("\n")
                    return text
                self.ui.idle()
            elif byte in (0x7F, 0x08):  # backspace
                if data:
                    del data[-1]
                    self.ui.write("\b \b")
            elif byte == 0x04 and not data:  # Ctrl-D on an empty line
                return None
            elif byte >= 0x20 or byte == 0x09:
                data.append(byte)
                self.ui.write_bytes(bytes([byte]))  # echo (UTF-8 passes through)

    def _echo_paste(self, pasted: bytes) -> None:
        text = pasted.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
        lines = text.count("\n") + 1
        self.ui.write(text if lines == 1 else f"[Pasted text +{lines} lines]")


# -- the agent ---------------------------------------------------------------


def handle(message: str, client: BridgeClient, ui: UI, busy_seconds: float) -> bool:
    """Work one turn. Returns False when the agent should exit."""
    command = message.strip()
    if command == "exit":
        ui.say("bye")
        return False
    result = error = None
    with Busy(ui):
        time.sleep(busy_seconds)
        slow = re.match(r"slow:(\d+(?:\.\d+)?):", command)
        if slow:  # a slow turn (a primary waiting on it for that long), then the rest of the message
            time.sleep(float(slow.group(1)))
            command = command[slow.end():]
        if command == "stall":
            while True:  # busy forever; input is never read again
                time.sleep(3600)
        try:
            if command == "done":
                pass
            elif command.startswith("reply:"):
                result = client.call_tool("bridge_reply", {"content": command[len("reply:"):]})
            elif command.startswith("ask:"):
                question = command[len("ask:"):]
                asked = client.call_tool("bridge_ask", {"content": question}, timeout=ASK_TIMEOUT)
                if "answer" in asked:
                    content = f"answered:{asked['answer']}"
                    slow = re.match(r"wait:(\d+(?:\.\d+)?):", asked["answer"])
                    if slow:  # the answer asks for a slow reply (a primary waiting on it for that long)
                        time.sleep(float(slow.group(1)))
                else:
                    content = f"unanswered:{asked.get('outcome', 'unknown')}"
                ui.say(f"asked {question!r} -> {json.dumps(asked)}")
                result = client.call_tool("bridge_reply", {"content": content})
            else:
                result = client.call_tool("bridge_reply", {"content": f"echo:{message}"})
        except (BridgeError, OSError, ValueError) as exc:  # URLError is an OSError
            error = f"bridge error: {exc}"
    if error:
        ui.say(error)
    elif result is None:
        ui.say("turn done (no reply)")
    else:
        ui.say(f"bridge_reply -> {json.dumps(result)}")
    return True


def main() -> int:
    url = os.environ.get("YUZU_BRIDGE_URL", "http://127.0.0.1:8000/mcp/bridge/")
    client = BridgeClient(url, os.environ.get("YUZU_BRIDGE_TOKEN"))
    busy_seconds = float(os.environ.get("YUZU_STANDIN_BUSY_SECONDS", "0.3"))
    ui = UI()
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd) if os.isatty(fd) else None
    if saved is not None:
        tty.setcbreak(fd)  # no line buffering, no echo; Ctrl-C still works
    ui.write("\033[?2004h")  # ask the terminal for bracketed paste
    ui.say(f"standin agent (bridge {url})")
    reader = InputReader(fd, ui)
    try:
        while True:
            ui.idle()
            message = reader.read_message()
            if message is None or not handle(message, client, ui, busy_seconds):
                return 0
    except KeyboardInterrupt:
        return 130
    finally:
        ui.write("\033[?2004l")
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


if __name__ == "__main__":
    sys.exit(main())
