"""The in-process channel layer of embedded mode (no Redis): Channels' layer API for one server process.

Channels' own InMemoryChannelLayer sweeps every channel and every group for expired messages on each send to a
group and on each receive, so one execution fanned out to N agents costs O(N²) — 5,000 agents never finish.
This layer keeps the same semantics (per-channel capacity, message expiry, a channel whose message expired
leaves its groups, group membership expiry) with the expiry work done by a sweep that runs at most once per
SWEEP_SECONDS and an index from each channel to its groups, so a send or a receive costs O(1) and a fan-out
to N agents O(N). It is our own implementation of the public ``BaseChannelLayer`` API, not a fork.

Both layers yuzu configures also offer ``group_send_many(groups, message)``: the same message to many groups in
one go (a fan-out to N agents, each on its own group). Here it is N puts after one sweep; on Redis
(``RedisChannelLayer`` below) it reads every group's members in one pipelined round trip and sends **one**
message per receiving process — channels-redis already stores a message for several channels of one process
once, with the list of its channels, and the receiving process hands it to each of them — instead of one
message (and four round trips at the receiver) per agent.
"""

import asyncio
import logging
import random
import re
import string
import time
from collections import defaultdict, deque
from collections.abc import Iterable
from copy import deepcopy
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import BaseChannelLayer
from channels_redis.core import RedisChannelLayer as _RedisChannelLayer

SWEEP_SECONDS = 1.0
log = logging.getLogger("yuzu.channel_layer")
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

    async def group_send_many(self, groups: Iterable[str], message: Message) -> None:
        """``group_send(group, message)`` for each group, with one expiry check for all of them."""
        self._sweep()
        for group in groups:
            self.require_valid_group_name(group)
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


class RedisChannelLayer(_RedisChannelLayer):  # type: ignore[misc]  # channels-redis has no type hints
    """channels-redis's layer, plus ``group_send_many``: a fan-out in a few round trips and one message per
    receiving process. Everything else is channels-redis's own."""

    async def group_send_many(self, groups: Iterable[str], message: Message) -> None:
        """Send ``message`` to every member of every group, as ``group_send`` per group would (a channel in
        two of the groups gets it once). Each connection's groups are read in one pipeline (dropping
        memberships past the group expiry, as ``group_send`` does); their channels are then sent to the way
        ``group_send`` sends to one group's: per Redis key (one per receiving process for process-local
        channels) one stored message listing that key's channels, written by one script call per connection,
        over-capacity keys skipped and logged."""
        by_connection: dict[int, list[str]] = defaultdict(list)
        for group in groups:
            assert self.require_valid_group_name(group), "Group name not valid"
            by_connection[self.consistent_hash(group)].append(group)
        cutoff = int(time.time()) - self.group_expiry
        names: dict[str, None] = {}
        for index, members_of in by_connection.items():
            pipe = self.connection(index).pipeline(transaction=False)
            for group in members_of:
                key = self._group_key(group)
                pipe.zremrangebyscore(key, min=0, max=cutoff)
                pipe.zrange(key, 0, -1)
            results = await pipe.execute()
            for members in results[1::2]:
                names.update((m.decode("utf8"), None) for m in members)
        if not names:
            return
        to_keys, key_message, key_capacity = self._map_channel_keys_to_connection(list(names), message)
        for index, keys in to_keys.items():
            connection = self.connection(index)
            pipe = connection.pipeline(transaction=False)
            for key in keys:
                pipe.zremrangebyscore(key, min=0, max=int(time.time()) - int(self.expiry))
            await pipe.execute()
            args = [key_message[k] for k in keys] + [key_capacity[k] for k in keys] + [time.time(), self.expiry]
            over = await connection.eval(_GROUP_SEND_LUA, len(keys), *keys, *args)
            if over:
                log.warning("%s of %s channel keys over capacity in a send to %s groups", over, len(keys),
                            sum(map(len, by_connection.values())))


# channels-redis's group_send script: per key, store the message unless the key is at capacity.
_GROUP_SEND_LUA = """
    local over_capacity = 0
    local current_time = ARGV[#ARGV - 1]
    local expiry = ARGV[#ARGV]
    for i=1,#KEYS do
        if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + #KEYS]) then
            redis.call('ZADD', KEYS[i], current_time, ARGV[i])
            redis.call('EXPIRE', KEYS[i], expiry)
        else
            over_capacity = over_capacity + 1
        end
    end
    return over_capacity
"""
