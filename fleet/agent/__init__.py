"""The yuzu agent: a small program for Linux endpoints that connects to the server over a WebSocket,
enrols with a device token, and runs plugin actions it is sent (docs/agent-protocol.md).

It imports nothing from Django, so it runs on an endpoint with just websockets, psutil and jsonschema."""

__version__ = "0.1.0"
