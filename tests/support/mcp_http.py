"""Raw-HTTP driving of the ASGI application in-process (no network), for the transport rules."""

import json

from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator

from yuzu.asgi import application

PATH = "/mcp/v1/"


class Resp:
    def __init__(self, raw):
        self.status = raw["status"]
        self.headers = {k.decode().lower(): v.decode() for k, v in raw.get("headers", [])}
        self.body = raw.get("body", b"")

    def json(self):
        return json.loads(self.body)

    @property
    def error(self):
        return self.json().get("error")


def request(method="POST", body=b"", headers=None, path=PATH):
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    hdrs = {"host": "127.0.0.1:8000", "content-type": "application/json",
            "accept": "application/json, text/event-stream"}
    if method in ("POST", "PUT", "PATCH"):
        hdrs["content-length"] = str(len(body))
    hdrs.update({k.lower(): v for k, v in (headers or {}).items()})
    hdrs = {k: v for k, v in hdrs.items() if v is not None}
    comm = HttpCommunicator(application, method, path, body=body,
                            headers=[(k.encode(), v.encode()) for k, v in hdrs.items()])
    return Resp(async_to_sync(comm.get_response)(timeout=30))


class McpClient:
    """A minimal session-aware client over ``request``."""

    def __init__(self, token, version="2025-11-25", path=PATH):
        self.token, self.version, self.path = token, version, path
        self.sid = None
        self._id = 0

    def headers(self, extra=None):
        h = {"authorization": f"Bearer {self.token}"} if self.token else {}
        if self.sid:
            h["mcp-session-id"] = self.sid
            h["mcp-protocol-version"] = self.version
        h.update(extra or {})
        return h

    def initialize(self):
        r = request(body={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                          "params": {"protocolVersion": self.version, "capabilities": {},
                                     "clientInfo": {"name": "test", "version": "0"}}},
                    headers=self.headers(), path=self.path)
        assert r.status == 200, r.body
        self.sid = r.headers["mcp-session-id"]
        return r

    def rpc(self, method, params=None, headers=None):
        self._id += 1
        msg = {"jsonrpc": "2.0", "id": self._id, "method": method}
        if params is not None:
            msg["params"] = params
        return request(body=msg, headers=self.headers(headers), path=self.path)

    def call(self, name, arguments=None, **kw):
        return self.rpc("tools/call", {"name": name, "arguments": arguments or {}}, **kw)
