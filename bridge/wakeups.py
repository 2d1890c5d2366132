"""Waking blocked calls: the channel-layer groups a waiter joins, and the wake sent after a commit.

Invariants:

* A wake carries no data. It only says "re-read your row now": every outcome is written to its Turn
  row (or the inbox) before anyone is woken, so a wake that is lost (the in-memory layer does not
  cross processes) or sent before the waiter subscribed costs at most one re-read interval
  (``YUZU_BRIDGE_RECHECK_SECONDS``, bridge/rendezvous.py), never an outcome.
* A wake is sent only after the transaction that wrote the outcome commits (``wake_on_commit``), so
  a woken waiter always finds what it was woken for.

This module imports nothing of the bridge: the models call it.
"""

import logging
import re

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger("yuzu.bridge")


def turn_group(turn_id):
    """The primary's bridge_send waiting on a turn."""
    return f"bridge.turn.{turn_id}"


def ask_group(turn_id):
    """The worker's bridge_ask waiting for the answer on a turn."""
    return f"bridge.ask.{turn_id}"


def inbox_group(key):
    """A bridge_poll long-poll waiting on a principal's inbox."""
    return "bridge.inbox." + re.sub(r"[^A-Za-z0-9._-]", "_", key)[:80]


def wake(*groups):
    layer = get_channel_layer()
    if layer is None:
        return
    for g in groups:
        try:
            async_to_sync(layer.group_send)(g, {"type": "bridge.wake"})
        except Exception:  # a lost wake costs at most one recheck interval
            log.debug("wake %s failed", g, exc_info=True)


def wake_on_commit(*groups):
    """Wake these groups once the current transaction commits (at once outside a transaction)."""
    groups = sorted(set(groups))
    if groups:
        transaction.on_commit(lambda: wake(*groups))
