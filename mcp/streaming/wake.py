"""Signals to a session's live streams, in whichever process holds them: every GET stream and every progress
follower of a session joins the session's channel-layer group. A signal only says "look now"; what to look at
is in the ring and the session store.

- ``mcp.wake``: new frames are on the ring;
- ``mcp.close`` (``reason``): the session ended (``session_deleted``: by its client's DELETE);
- ``mcp.superseded`` (``stream``): another GET took the session's stream over;
- ``mcp.cancel`` (``request_id``): notifications/cancelled for a streamed call followed elsewhere.

A user's 2026-07-28 listen streams (they have no session) join the user's listen group instead:

- ``mcp.rbac_changed``: a role change may have altered what the user's tokens are listed.
"""

from asgiref.sync import async_to_sync
from channels.layers import BaseChannelLayer, get_channel_layer
from django.core.exceptions import ImproperlyConfigured

from .ring import ring_key, rings
from .stream import Message


def wake_group(key: str) -> str:
    return f"mcp.stream.{key}"


def channel_layer() -> BaseChannelLayer:
    """The layer a live stream listens on: settings always configure one (CHANNEL_LAYERS)."""
    layer = get_channel_layer()
    if layer is None:
        raise ImproperlyConfigured("MCP streams need a channel layer: CHANNEL_LAYERS has no default")
    return layer


def wake(key: str, message: Message | None = None) -> None:
    """Signal the session's live streams (sync callers)."""
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(wake_group(key), message or {"type": "mcp.wake"})


async def awake(key: str, message: Message | None = None) -> None:
    """Signal the session's live streams (async callers)."""
    layer = get_channel_layer()
    if layer is not None:
        await layer.group_send(wake_group(key), message or {"type": "mcp.wake"})


def close_session_streams(principal_key: str, session_id: str) -> None:
    """The client DELETEd its session: its live streams end (``session_deleted``: no close frame, stream.py)
    and its ring is dropped."""
    key = ring_key(principal_key, session_id)
    try:
        wake(key, {"type": "mcp.close", "reason": "session_deleted"})
    finally:
        rings().drop(key)


def listen_group(user_id: int) -> str:
    return f"mcp.listen.u{user_id}"


def wake_listeners(user_id: int) -> None:
    """Tell the user's listen streams, in any process, that what they are listed may have changed (sync)."""
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(listen_group(user_id), {"type": "mcp.rbac_changed"})
