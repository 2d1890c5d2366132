"""WebSocket routes of the fleet app; yuzu/asgi.py mounts them under its URLRouter."""

from yuzu.routing import path

from .consumers import AgentConsumer

websocket_urlpatterns = [
    path("agent/v1/ws", AgentConsumer.as_asgi()),
]
