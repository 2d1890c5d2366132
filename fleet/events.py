"""Execution progress events on the channel layer: every change to an execution's counters or status is
published to the group ``execution.<id>``, which MCP progress streams and the SSE events view follow.
Best effort: a layer failure is logged, never raised (the rows are the truth; events are hints).

``publish`` (sync: services, the sweep, a database thread) and ``apublish`` (from the event loop: the agent
consumers' batcher) are the one publisher."""

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger("yuzu.fleet")


def execution_group(execution_id):
    return f"execution.{execution_id}"


def event(execution):
    return {
        "type": "execution.event", "execution_id": execution.id, "status": str(execution.status),
        "agents_targeted": execution.agents_targeted, "agents_responded": execution.agents_responded,
        "agents_success": execution.agents_success, "agents_failure": execution.agents_failure,
        "terminal": execution.is_terminal,
        **({"status_reason": execution.last_error_detail} if execution.last_error_detail else {}),  # why it stopped
    }


async def apublish(*executions):
    """One event per execution, in order."""
    layer = get_channel_layer()
    for ex in executions if layer is not None else ():
        try:
            await layer.group_send(execution_group(ex.id), event(ex))
        except Exception:
            log.warning("publishing an event for execution %s failed", ex.id, exc_info=True)


def publish(*executions):
    """``apublish`` from synchronous code (one hop into the event loop for all of them)."""
    if not executions or get_channel_layer() is None:
        return
    try:
        async_to_sync(apublish)(*executions)
    except Exception:
        log.warning("publishing events for executions %s failed", ", ".join(ex.id for ex in executions),
                    exc_info=True)
