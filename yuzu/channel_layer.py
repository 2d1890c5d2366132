"""The in-process channel layer of embedded mode (no Redis): Channels' layer API for one server process.

Channels' own InMemoryChannelLayer sweeps every channel and every group for expired messages on each send to a
group and on each receive, so one execution fanned out to N agents costs O(N²) — 5,000 agents never finish.
This layer keeps the same semantics (per-channel capacity, message expiry, a channel whose message expired
leaves its groups, group membership expiry) with the expiry work done by a sweep that runs at most once per
SWEEP_SECONDS and an index from each channel to its groups, so a send or a receive costs O(1) and a fan-out
to N agents O(N). It is our own implementation of the public ``BaseChannelLayer`` API, not a fork.
"""

import asyncio
import random
import re
import string
import time
from collections import deque
from copy import deepcopy
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import BaseChannelLayer

SWEEP_SECONDS = 1.0
Message = dict[str, Any]


class _Channel:
    __slots__ = ("messages", "waiters")

    def __init__(self) -> None:
        self.messages: deque[tuple[float, Message]] = deque()  # (expires at, message)
        self.waiters: deque[asyncio.Future[Message]] = deque()


class LocalChannelLayer(BaseChannelLayer):
    extensions = ["groups", "flush"]

    def __init__(self, expiry: int = 60, group_expiry: int = 86400, capacity: int = 100,
                 channel_capacity: dict[re.Pattern[str] | str, int] | None = None, **kwargs: Any) -> None:
        super().__init__(expiry=expiry, capacity=capacity, channel_capacity=channel_capacity, **kwargs)
        self.group_expiry = group_expiry
        self.channels: dict[str, _Channel] = {}
        self.groups: dict[str, dict[str, float]] = {}  # group → {channel: joined at}
        self.memberships: dict[str, set[str]] = {}  # channel → its groups
        self._next_sweep = 0.0

    # --- channels ------------------------------------------------------------------------------------

    async def send(self, channel: str, message: Message) -> None:
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_channel_name(channel)
        assert "__asgi_channel__" not in message
        self._sweep()
        self._put(channel, message)

    def _put(self, channel: str, message: Message) -> None:
        ch = self.channels.setdefault(channel, _Channel())
        while ch.waiters:
            waiter = ch.waiters.popleft()
            if not waiter.done():
                waiter.set_result(deepcopy(message))
                return
        if len(ch.messages) >= self.get_capacity(channel):
            raise ChannelFull(channel)
        ch.messages.append((time.time() + self.expiry, deepcopy(message)))

    async def receive(self, channel: str) -> Message:
        self.require_valid_channel_name(channel)
        self._sweep()
        ch = self.channels.setdefault(channel, _Channel())
        try:
            now = time.time()
            while ch.messages:
                expires, message = ch.messages.popleft()
                if expires >= now:
                    return message
            waiter: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
            ch.waiters.append(waiter)
            try:
                return await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():  # handed over just as the receiver was cancelled
                    ch.messages.appendleft((time.time() + self.expiry, waiter.result()))
                raise
            finally:
                if waiter in ch.waiters:
                    ch.waiters.remove(waiter)
        finally:
            if not ch.messages and not ch.waiters and self.channels.get(channel) is ch:
                del self.channels[channel]

    async def new_channel(self, prefix: str = "specific.") -> str:
        return f"{prefix}.inmemory!{''.join(random.choice(string.ascii_letters) for _ in range(12))}"

    # --- expiry --------------------------------------------------------------------------------------

    def _sweep(self) -> None:
        """Drop expired messages (their channel leaves its groups: nobody is reading it) and expired group
        memberships — at most once per SWEEP_SECONDS, so its O(channels + memberships) is paid once a second,
        not once a message."""
        now = time.time()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_SECONDS
        for channel, ch in list(self.channels.items()):
            expired = False
            while ch.messages and ch.messages[0][0] < now:
                ch.messages.popleft()
                expired = True
            if expired:
                self._leave_groups(channel)
                if not ch.messages and not ch.waiters:
                    del self.channels[channel]
        joined_before = now - self.group_expiry
        for group, members in list(self.groups.items()):
            for channel, joined in list(members.items()):
                if joined < joined_before:
                    self._discard(group, channel)

    def _leave_groups(self, channel: str) -> None:
        for group in list(self.memberships.get(channel, ())):
            self._discard(group, channel)

    # --- groups --------------------------------------------------------------------------------------

    async def group_add(self, group: str, channel: str) -> None:
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)
        self.groups.setdefault(group, {})[channel] = time.time()
        self.memberships.setdefault(channel, set()).add(group)

    async def group_discard(self, group: str, channel: str) -> None:
        self.require_valid_channel_name(channel)
        self.require_valid_group_name(group)
        self._discard(group, channel)

    def _discard(self, group: str, channel: str) -> None:
        members = self.groups.get(group)
        if members is not None:
            members.pop(channel, None)
            if not members:
                del self.groups[group]
        groups = self.memberships.get(channel)
        if groups is not None:
            groups.discard(group)
            if not groups:
                del self.memberships[channel]

    async def group_send(self, group: str, message: Message) -> None:
        assert isinstance(message, dict), "Message is not a dict"
        self.require_valid_group_name(group)
        self._sweep()
        for channel in list(self.groups.get(group, ())):
            try:
                self._put(channel, message)
            except ChannelFull:
                pass

    # --- flush ---------------------------------------------------------------------------------------

    async def flush(self) -> None:
        self.channels, self.groups, self.memberships = {}, {}, {}

    async def close(self) -> None:
        pass
