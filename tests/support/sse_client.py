"""In-process SSE driving: an ASGI request whose response body arrives chunk by chunk."""

import asyncio
import json

from asgiref.testing import ApplicationCommunicator


def parse_events(text):
    """SSE text → list of dicts {id?, event?, data?, comment?}."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        ev = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                ev["comment"] = line[1:].strip()
            elif ":" in line:
                k, _, v = line.partition(":")
                ev[k] = v[1:] if v.startswith(" ") else v
        if "data" in ev and ev["data"]:
            ev["json"] = json.loads(ev["data"])
        out.append(ev)
    return out


class Stream:
    def __init__(self, app, method, path, headers, body=b""):
        hdrs = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        if method == "POST":
            hdrs.append((b"content-length", str(len(body)).encode()))
        self.comm = ApplicationCommunicator(app, {
            "type": "http", "http_version": "1.1", "method": method, "path": path, "raw_path": path.encode(),
            "query_string": b"", "headers": hdrs, "scheme": "http", "server": ("127.0.0.1", 8000),
            "client": ("127.0.0.1", 5555),
        })
        self.body = body
        self.status = None
        self.headers = {}
        self.buffer = ""
        self.finished = False

    async def open(self, timeout=10):
        await self.comm.send_input({"type": "http.request", "body": self.body, "more_body": False})
        start = await self.comm.receive_output(timeout)
        assert start["type"] == "http.response.start", start
        self.status = start["status"]
        self.headers = {k.decode(): v.decode() for k, v in start["headers"]}
        return self

    async def read_until(self, predicate, timeout=10):
        """Read body chunks until predicate(events) is true; returns the events parsed so far."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            events = parse_events(self.buffer) if not self.headers.get("content-type", "").startswith(
                "application/json") else []
            if self.finished or predicate(events):
                return events
            left = deadline - loop.time()
            if left <= 0:
                raise AssertionError(f"timed out; got {events}")
            if self.comm.future.done():
                self.comm.future.result()  # surface an application crash
            try:  # not receive_output(): its timeout would cancel the application
                msg = await asyncio.wait_for(self.comm.output_queue.get(), min(left, 0.5))
            except TimeoutError:
                continue
            if msg["type"] == "http.response.body":
                self.buffer += msg.get("body", b"").decode()
                if not msg.get("more_body"):
                    self.finished = True

    async def read_body(self, timeout=10):
        """A non-streamed reply: read it to the end."""
        await self.read_until(lambda ev: False if not self.finished else True, timeout)
        return self.buffer

    async def disconnect(self):
        await self.comm.send_input({"type": "http.disconnect"})
        try:
            await self.comm.wait(2)
        except Exception:
            pass
