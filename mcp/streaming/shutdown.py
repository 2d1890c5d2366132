"""A stopping daphne process says goodbye on every stream it holds.

On SIGTERM/SIGINT daphne's "before shutdown" trigger cancels every application instance, and the first one
to finish releases the reactor to disconnect all sockets at once — so a close frame written from a cancelled
consumer may never leave the process. ``track`` hooks a trigger of our own (Twisted's public
``addSystemEventTrigger``) that writes every live stream's session_terminated close frame and holds the
shutdown until the frames are flushed (SHUTDOWN_FLUSH_SECONDS), bounded by SHUTDOWN_WAIT_SECONDS."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

from twisted.internet.defer import Deferred

if TYPE_CHECKING:
    from .stream import Stream

SHUTDOWN_FLUSH_SECONDS = 0.2  # lets the transport write the shutdown close frames before daphne drops sockets
SHUTDOWN_WAIT_SECONDS = 5.0  # the most a stop waits for this process's streams to say goodbye
SHUTDOWN_REMEDIATION = ("this server process is stopping: reconnect (GET with Last-Event-ID) to another instance, "
                        "or re-initialize; results stay fetchable by execution_id")

_open: set[Stream] = set()  # every held-open stream of this process (GET and streamed POST)
_hooked = False


def track(stream: Stream) -> None:
    """``stream`` is held open: close it with a frame if the process stops."""
    _open.add(stream)
    _hook()


def untrack(stream: Stream) -> None:
    _open.discard(stream)


def _hook() -> None:
    global _hooked
    if _hooked:
        return
    reactor = sys.modules.get("twisted.internet.reactor")
    if reactor is None or not getattr(reactor, "running", False):
        return  # not served by daphne (e.g. the in-process test communicator): nothing to hook
    _hooked = True
    reactor.addSystemEventTrigger("before", "shutdown", _before_shutdown)


def _before_shutdown() -> Deferred[None] | None:
    streams = list(_open)
    if not streams:
        return None

    async def close_all() -> None:
        tasks = [asyncio.ensure_future(stream.shutdown()) for stream in streams]
        await asyncio.wait(tasks, timeout=SHUTDOWN_WAIT_SECONDS)

    return Deferred.fromFuture(asyncio.ensure_future(close_all()))
