"""Pushes state to connected agents through the channel layer."""

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger("yuzu.fleet")


def agent_group(agent_id):
    return "agent." + "".join(c if c.isalnum() or c in "-_." else "_" for c in agent_id)[:90]


def push_tags(agent_id):
    from .models import Tag

    tags = dict(Tag.objects.filter(agent_id=agent_id).values_list("key", "value"))
    send_to_agent(agent_id, {"type": "agent.push", "payload": {"type": "tags", "tags": tags}})


def send_to_agent(agent_id, message):
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(agent_group(agent_id), message)
    except Exception:  # an offline layer must not fail the tag write; the agent re-syncs on connect
        log.warning("push to agent %s failed", agent_id, exc_info=True)
