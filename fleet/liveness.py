"""The agent connections of this server process, and its touch: every third of a heartbeat interval, one UPDATE
(AgentQuerySet.touch) refreshes ``last_seen`` of every agent whose open connection this process holds, so
the sweep (fleet.tasks) tells an agent whose frames are not yet read from one that is gone
(docs/fleet.md, "Liveness").

Under load the consumers' database hops queue on the one database thread of the process (channels'
``database_sync_to_async``) behind the backlog of frames, heartbeats included; a heartbeat processed late
once let the sweep mark agents with open sockets disconnected. The touch reads only the consumers' state in
memory and runs on its own thread (its own database connection), so it does not wait behind that backlog.

What the touch leaves out, so that the sweep still catches it after SILENT_INTERVALS heartbeat intervals:

- the agents of a process that died without closing their sockets — nothing touches them any more;
- a silent socket: a consumer that is idle (no frame being handled, none waiting) and took no frame for
  SILENT_INTERVALS intervals. Its peer sends nothing — a hung agent program whose socket is still open.
  Marked disconnected as before (new executions leave it out), the socket is left open: a heartbeat marks
  the agent connected again. A peer that stops answering WebSocket pings is closed by daphne itself
  (``--ping-interval`` 20 s, ``--ping-timeout`` 30 s); its close marks it disconnected.
- connections that are closing or superseded by a newer connection of their agent.

A consumer handles one message at a time (a frame from its agent or a channel-layer message for it), so
one that has been idle for CAUGHT_UP_IDLE_S has read and handled every frame its agent sent before that
(an acknowledgement is stored before the next message is handled) and relayed every command that reached
it. The touch records that as the agent's ``caught_up_at``: an unacknowledged command sent well before it
may be lost, and fleet.tasks re-sends on that evidence."""

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from channels.db import database_sync_to_async
from django.db import connection
from django.utils import timezone

from .models import SILENT_INTERVALS, Agent, heartbeat_interval, touch_interval

log = logging.getLogger("yuzu.fleet.agents")

CAUGHT_UP_IDLE_S = 1.0  # idle this long after its last message: the acknowledgement of a relayed command is back
TOUCH_CHUNK = 5000  # agents per UPDATE (two bound parameters each); one statement up to this many per process


class Connection(Protocol):
    """What the touch reads of an agent consumer (fleet.consumers.AgentConsumer)."""

    agent_id: str | None
    closing: bool
    superseded: bool
    handling: bool  # a message of this connection is being handled
    heard: float  # time.monotonic() when the consumer last took a frame from its agent
    idle_since: float  # time.monotonic() when it last finished handling a message


def _touch(alive: list[str], caught_up: list[str]) -> None:
    now = timezone.now()
    try:
        for i in range(0, len(alive), TOUCH_CHUNK):
            chunk = alive[i:i + TOUCH_CHUNK]
            ids = set(chunk)
            Agent.objects.touch(chunk, [a for a in caught_up if a in ids], now)
    finally:
        connection.close()  # one connection per interval, not one more held open per server process


# Its own thread, so its own database connection, never queued behind the consumers' hops.
_touch_hop = database_sync_to_async(_touch, thread_sensitive=False,
                                    executor=ThreadPoolExecutor(max_workers=1, thread_name_prefix="yuzu-touch"))


class Connections:
    """The registered agent connections of this server process (per event loop, like the response
    batcher) and the task that touches them every touch_interval() while there are any."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.open: set[Connection] = set()
        self.task: asyncio.Task[None] | None = None

    def add(self, conn: Connection) -> None:
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # a new event loop (tests): nothing of the old one survives it
            self.loop, self.open, self.task = loop, set(), None
        self.open.add(conn)
        if self.task is None:
            self.task = loop.create_task(self.run())

    def discard(self, conn: Connection) -> None:
        self.open.discard(conn)

    def state(self, now: float | None = None) -> tuple[list[str], list[str]]:
        """(alive, caught up) agent ids as of ``now`` (time.monotonic()); see the module docstring."""
        now = time.monotonic() if now is None else now
        silent_after = SILENT_INTERVALS * heartbeat_interval()
        alive, caught_up = [], []
        for c in list(self.open):
            if c.agent_id is None or c.closing or c.superseded:
                continue
            idle = not c.handling
            if idle and now - c.heard > silent_after:
                continue
            alive.append(c.agent_id)
            if idle and now - c.idle_since >= CAUGHT_UP_IDLE_S:
                caught_up.append(c.agent_id)
        return alive, caught_up

    async def touch(self) -> int:
        """One touch now; returns how many connections it found alive."""
        alive, caught_up = self.state()
        if alive:
            await _touch_hop(alive, caught_up)
        return len(alive)

    async def run(self) -> None:
        try:
            while self.open:
                await asyncio.sleep(touch_interval())
                try:
                    await self.touch()
                except Exception:  # the database is away: the next interval tries again
                    log.warning("touching %d agent connections failed", len(self.open), exc_info=True)
        finally:
            if self.loop is asyncio.get_running_loop():
                self.task = None


connections = Connections()
