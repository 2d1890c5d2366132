"""Receivers of the agent protocol's telemetry signal (fleet.signals.agent_telemetry): heartbeat facts go to the
in-process buffer, observations and app rows to the database. Validation drops and counts bad values
(dex.telemetry); nothing here can close the agent's connection."""

from channels.db import database_sync_to_async
from django.dispatch import receiver

from fleet.signals import agent_telemetry

from . import alerts, ingest


@receiver(agent_telemetry)
async def on_telemetry(sender, agent_id, kind, frame, **kwargs):
    if kind == "heartbeat":
        values = ingest.accept_facts(frame.get("dex"))
        if values is not None:
            ingest.facts_buffer.put(agent_id, values)
    elif kind == "dex.observation":
        items = frame.get("observations")  # a list of ≤100 (fleet.consumers)
        granted = ingest.observation_budget.take(agent_id, len(items))
        if granted < len(items):
            ingest.count_dropped([("observations", "over_budget")] * (len(items) - granted))
            items = items[:granted]
        stored = items and await database_sync_to_async(ingest.store_observations)(agent_id, items)
        if stored:
            await database_sync_to_async(alerts.check_blast_radius)(agent_id)
    elif kind == "dex.app_perf":
        if not ingest.app_perf_budget.take(agent_id, 1):
            ingest.count_dropped([("rows", "over_budget")])
            return
        await database_sync_to_async(ingest.store_app_days)(agent_id, frame.get("day"), frame.get("rows"))
