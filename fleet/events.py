"""Execution progress events on the channel layer: every change to an execution's counters or status is
published to the group ``execution.<id>``, which MCP progress streams and the SSE events view follow."""

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger("yuzu.fleet")


def execution_group(execution_id):
    return f"execution.{execution_id}"


def event(execution):
    return {
        "type": "execution.event", "execution_id": execution.id, "status": execution.status,
        "agents_targeted": execution.agents_targeted, "agents_responded": execution.agents_responded,
        "agents_success": execution.agents_success, "agents_failure": execution.agents_failure,
        "terminal": execution.is_terminal,
    }


def publish(execution):
    """Best effort: a layer failure is logged, never raised (the rows are the truth; events are hints)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(execution_group(execution.id), event(execution))
    except Exception:
        log.warning("publishing an event for execution %s failed", execution.id, exc_info=True)
