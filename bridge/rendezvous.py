"""The blocking half of the rendezvous: waits that hold an MCP call open without a thread.

A waiter makes its own channel on the channel layer, joins the turn's group and awaits ``receive``
with a timeout. The truth is the Turn row (bridge/turns.py writes the outcome there first); a
wake only says "re-read now" (bridge/wakeups.py). The row is also re-read every
``YUZU_BRIDGE_RECHECK_SECONDS`` so a wake lost across processes (the in-memory layer does not cross them)
or one sent before the waiter subscribed still resolves it. With YUZU_REDIS_URL set (channels-redis), a reply handled by another
server process wakes the waiter at once.
"""

import asyncio
import logging
import secrets
import time

from channels.layers import get_channel_layer

from mcp.pipeline import hop

from . import conf, turns, waiters
from .reads import inbox_items
from .wakeups import ask_group, inbox_group, turn_group

log = logging.getLogger("yuzu.bridge")


async def _wait(groups, check, deadline, beat=None):
    """Loop: ``check(final)`` (a sync function run in a worker thread) until it returns a value.
    ``deadline`` is a time.monotonic() value; the last check passes final=True. ``beat()`` (sync), when given,
    runs first and then at least every waiters.RENEW_SECONDS: it renews the wait's lease."""
    layer = get_channel_layer()
    channel = None
    if layer is not None:
        try:
            # The default prefix on purpose: channels-redis serves every process-local channel of one
            # prefix from one receive loop; a channel with its own prefix would starve behind the
            # receive loop of the consumers' channels (their prefix is the default one).
            channel = await layer.new_channel()
            for g in groups:
                await layer.group_add(g, channel)
        except Exception:  # no layer: the periodic re-read alone resolves the wait
            log.warning("channel layer unavailable; bridge waits fall back to re-reading", exc_info=True)
            channel = None
    beaten = None
    try:
        while True:
            if beat is not None and (beaten is None or time.monotonic() - beaten >= waiters.RENEW_SECONDS):
                await hop(beat)()
                beaten = time.monotonic()
            remaining = deadline - time.monotonic()
            out = await hop(check)(remaining <= 0)
            if out is not None:
                return out
            pause = min(max(remaining, 0.0), conf.recheck_seconds())
            if beat is not None:
                pause = min(pause, waiters.RENEW_SECONDS)
            if channel is not None:
                try:
                    await asyncio.wait_for(layer.receive(channel), timeout=pause)
                except TimeoutError:
                    pass
            else:
                await asyncio.sleep(pause)
    finally:
        if channel is not None:
            for g in groups:
                try:
                    await layer.group_discard(g, channel)
                except Exception:
                    pass


async def prepare_send(caller, content, **kwargs):
    """turns.prepare_send for the tool: when it must watch an earlier wait's lease (``turns.Undecided``, up to a
    lease's length), the watch awaits here, on the event loop — a sleeping hop would hold one of the few threads
    every server call shares (mcp.pipeline), and a handful of such sends stalled every user's calls."""
    watched = None
    while True:
        try:
            return await hop(turns.prepare_send)(caller, content, watched=watched, block=False, **kwargs)
        except turns.Undecided as undecided:
            watched = (undecided.turn_pk, await outlives_a_lease(undecided.turn_pk))


async def outlives_a_lease(turn_pk):
    """turns._outlives_a_lease without a thread: whether the turn's wait lease stays alive for a lease's length."""
    until = time.monotonic() + waiters.LEASE_SECONDS + turns.LEASE_WATCH_SLACK
    while time.monotonic() < until:
        if not await hop(waiters.leases().alive)(turn_pk):
            return False
        await asyncio.sleep(turns.LEASE_WATCH_STEP)
    return True


def _deadline(prepared_deadline_ms):
    return time.monotonic() + max(0, prepared_deadline_ms) / 1000.0


async def wait_turn(prepared, timeout_ms):
    """The primary's bridge_send wait: exactly one outcome (reply, question, turn_done, timeout,
    cancelled) or an error outcome (worker_gone, delivery_failed)."""
    deadline = _deadline(timeout_ms)
    owner = prepared.lease or secrets.token_hex(8)  # prepare_send took it; keep renewing it
    try:
        # The wait holds a lease on its turn while it lives: a re-send finds a turn whose waiter died with its
        # process (no lease, no recorded drop) instead of pasting the message twice (bridge/waiters.py).
        return await _wait([turn_group(prepared.turn_id)], lambda final: turns.take_outcome(prepared.turn_pk, final),
                           deadline, beat=lambda: waiters.leases().hold(prepared.turn_pk, owner))
    except asyncio.CancelledError:
        # The client went away (daphne cancels the request): later outcomes go to the inbox.
        try:
            await asyncio.shield(hop(turns.release_waiter)(prepared.turn_pk))
        finally:
            raise
    finally:
        try:
            await asyncio.shield(hop(waiters.leases().release)(prepared.turn_pk, owner))
        except Exception:  # the store is away: the lease runs out by itself
            log.warning("could not release the wait lease of turn %s", prepared.turn_id, exc_info=True)


async def wait_answer(turn_pk, turn_id, seq, timeout_ms):
    """The worker's bridge_ask wait: {answer} once the primary answers, else timeout/cancelled."""
    deadline = _deadline(timeout_ms)
    try:
        return await _wait([ask_group(turn_id)], lambda final: turns.check_answer(turn_pk, seq, final), deadline)
    except asyncio.CancelledError:
        # The worker's client went away: its re-send of this question gets the answer rather than asking again.
        try:
            await asyncio.shield(hop(turns.ask_dropped)(turn_pk, seq))
        finally:
            raise


async def wait_inbox(key, limit, timeout_ms):
    """bridge_poll's long-poll: return as soon as the caller's inbox holds something."""
    deadline = _deadline(timeout_ms)

    def check(final):
        items = inbox_items(key, limit)
        return items if items or final else None

    return await _wait([inbox_group(key)], check, deadline)
