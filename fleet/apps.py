from django.apps import AppConfig
from django.db import transaction
from django.db.models.signals import post_delete

from .layer import send_to_agent


def _agent_deleted(sender, instance, **kwargs):
    """An Agent deleted (the admin, a service, a cascade): its live connection closes once the delete commits,
    through the channel layer (AgentConsumer.agent_cut_off), not at its next write; its heartbeat checks too."""
    agent_id = instance.pk
    transaction.on_commit(lambda: send_to_agent(agent_id, {"type": "agent.cut_off", "why": "agent deleted"}))


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Fleet: agents, tags, groups, executions"

    def ready(self):
        post_delete.connect(_agent_deleted, sender="fleet.Agent", dispatch_uid="fleet.agent_deleted")
