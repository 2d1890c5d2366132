"""The yuzu agent: a small program for Linux endpoints that connects to the server over a WebSocket,
enrols with a device token, and runs plugin actions it is sent (docs/agent-protocol.md).

It imports nothing from Django, so it runs on an endpoint with just websockets, psutil and jsonschema."""

import os

__version__ = "0.1.0"


def write_private(path, data: bytes):
    """``data`` into ``path`` owner-only (0600), through a temporary file renamed over it: the agent's state (its
    key, certificate, credential, sync state) never exists world-readable or half-written."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
