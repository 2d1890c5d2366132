"""An agent's channel-layer group and a send to it, importing no model: fleet.apps connects a receiver that
sends (an Agent deleted) before the app registry is ready. fleet.push re-exports both."""

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger("yuzu.fleet")


def agent_group(agent_id):
    return "agent." + "".join(c if c.isalnum() or c in "-_." else "_" for c in agent_id)[:90]


def send_to_agent(agent_id, message):
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(agent_group(agent_id), message)
    except Exception:  # an offline layer must not fail the tag write; the agent re-syncs on connect
        log.warning("push to agent %s failed", agent_id, exc_info=True)
