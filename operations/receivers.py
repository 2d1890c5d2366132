"""Receivers of the agent protocol's signals (fleet.signals): the plugin state an agent needs on connect,
and the operator surface's report kinds — ``software``, ``licenses``, ``plugin_state`` — validated here
before anything is stored (a malformed report is logged and dropped; the agent's connection stays up)."""

import asyncio
import logging

from channels.db import database_sync_to_async
from django.conf import settings
from django.dispatch import receiver

from fleet.models import AgentInventory
from fleet.push import send_to_agent
from fleet.signals import agent_connected, agent_disconnected, agent_report

from . import inventory, plugins, schedules

log = logging.getLogger("yuzu.operations")


@receiver(agent_connected)
def sync_plugin_state(sender, agent_id, **kwargs):
    plugins.sync_agent(agent_id)


def _plugin_state(agent_id, report):
    config, off = report.get("config"), report.get("switched_off")
    if not isinstance(config, dict) or len(config) > 256 or not isinstance(off, list) or len(off) > 4096 or \
            not all(isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in config.items()) or \
            not all(isinstance(x, str) and len(x) <= 140 for x in off):
        raise inventory.Malformed("plugin_state needs config {plugin: sha256} and switched_off [names]")
    AgentInventory.objects.store(agent_id, "plugin_state", {"config": config, "switched_off": off})


def handle_report(agent_id, frame):
    kind, report = frame.get("kind"), frame.get("report")
    if kind not in ("software", "licenses", "plugin_state"):
        return
    if not isinstance(report, dict):
        log.warning("dropped a %s report of agent %s: 'report' must be an object", kind, agent_id)
        return
    try:
        if kind == "software":
            reply = inventory.receive_software(agent_id, report)
            if reply is not None:
                send_to_agent(agent_id, {"type": "agent.push", "payload": reply})
        elif kind == "licenses":
            inventory.receive_licenses(agent_id, report)
        else:
            _plugin_state(agent_id, report)
    except inventory.Malformed as exc:
        log.warning("dropped a malformed %s report of agent %s: %s", kind, agent_id, exc)


@receiver(agent_report)
def on_report(sender, agent_id, frame, **kwargs):
    handle_report(agent_id, frame)


@receiver(agent_disconnected)
def forget_staged_software(sender, agent_id, **kwargs):
    inventory.forget_staged(agent_id)


_ticker = None


@receiver(agent_connected)
async def schedule_in_the_server(sender, **kwargs):
    """Embedded mode (no Redis): schedules tick on the server's own event loop, where the in-memory channel
    layer reaches the agents (as compliance's evaluator does). With Redis, Celery beat runs the tick."""
    global _ticker
    if settings.REDIS_URL or (_ticker is not None and not _ticker.done()):
        return
    _ticker = asyncio.create_task(_tick_forever(float(getattr(settings, "YUZU_SCHEDULE_TICK_S", 30))))


async def _tick_forever(every):
    while True:
        await asyncio.sleep(every)
        try:
            await database_sync_to_async(schedules.tick)()
        except Exception:
            log.exception("schedule tick failed")
