"""What the agent protocol tells other apps, without fleet knowing them: they connect receivers in their
AppConfig.ready (compliance: startup-triggered policy checks, Guardian events)."""

from django.dispatch import Signal

#: an agent registered on a connection (kwargs: agent_id)
agent_connected = Signal()
#: an agent's registered connection closed, however it ended (kwargs: agent_id); not sent for a superseded one
agent_disconnected = Signal()
#: an agent sent a report frame of an app's kind (kwargs: agent_id — the authenticated connection's —, frame)
agent_report = Signal()
#: an agent sent DEX telemetry (kwargs: agent_id, kind — "heartbeat", "dex.observation" or "dex.app_perf" —, frame);
#: the receiving app validates every field itself (docs/agent-protocol.md)
agent_telemetry = Signal()
