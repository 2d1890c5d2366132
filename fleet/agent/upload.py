"""The agent side of an upload grant (docs/operator.md): push one file to the server over its HTTPS upload
routes, in chunks, resuming from the server's recorded offset after a failed chunk. Imports nothing of the
server; the plugin ``content_dist.upload_file`` (fleet.agent.plugins) wraps ``upload_file``."""

import hashlib
import json
import os
import ssl
import urllib.error
import urllib.request
from urllib.parse import urlsplit, urlunsplit

CHUNK_DEFAULT = 4 * 1024 * 1024
MAX_RETRIES = 3


class UploadRefused(Exception):
    def __init__(self, status, reason, message):
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason = status, reason


def http_base(server):
    """The server's HTTP(S) origin from the agent's WebSocket URL (wss → https, ws → http)."""
    parts = urlsplit(server)
    scheme = {"wss": "https", "ws": "http"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "", "", ""))


def _call(method, url, headers, body=None, context=None, timeout=60):
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            err = json.loads(exc.read() or b"{}").get("error") or {}
        except ValueError:
            err = {}
        raise UploadRefused(exc.code, err.get("reason") or "", err.get("message") or str(exc)) from None


def upload_file(path, grant_id, grant_secret, server, *, cafile=None, timeout=60):
    """Redeem the grant, send the file, commit with its SHA-256. Returns the commit answer."""
    base = http_base(server) + "/api/v1/uploads"
    context = ssl.create_default_context(cafile=cafile) if base.startswith("https") else None
    size = os.path.getsize(path)
    status, opened = _call("POST", base, {"X-Yuzu-Upload-Grant": f"{grant_id}.{grant_secret}",
                                          "Content-Type": "application/json"},
                           json.dumps({"size": size}).encode(), context, timeout)
    upload_id, session = opened["upload_id"], opened["session_secret"]
    chunk_max = min(int(opened.get("chunk_max_bytes") or CHUNK_DEFAULT), CHUNK_DEFAULT)
    auth = {"X-Yuzu-Upload-Session": session}
    digest = hashlib.sha256()
    offset, retries = 0, 0
    with open(path, "rb") as f:
        while offset < size or size == 0:
            f.seek(offset)
            chunk = f.read(chunk_max)
            end = offset + len(chunk) - 1
            try:
                _, got = _call("PUT", f"{base}/{upload_id}/chunk",
                               {**auth, "Content-Range": f"bytes {offset}-{end}/{size}",
                                "Content-Type": "application/octet-stream"}, chunk, context, timeout)
            except UploadRefused as exc:
                if exc.reason != "offset_mismatch" or retries >= MAX_RETRIES:
                    raise
                retries += 1
                _, state = _call("GET", f"{base}/{upload_id}", auth, None, context, timeout)
                offset = int(state["offset"])  # resume where the server is
                continue
            except OSError:
                if retries >= MAX_RETRIES:
                    raise
                retries += 1
                _, state = _call("GET", f"{base}/{upload_id}", auth, None, context, timeout)
                offset = int(state["offset"])
                continue
            offset = int(got.get("offset", end + 1))
            if size == 0:
                break
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    _, done = _call("POST", f"{base}/{upload_id}/commit", {**auth, "Content-Type": "application/json"},
                    json.dumps({"sha256": digest.hexdigest()}).encode(), context, timeout)
    return {"upload_id": upload_id, **done}
