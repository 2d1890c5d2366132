"""ASGI entry point: MCP endpoints and the agent WebSocket on Channels, everything else on Django; every HTTP
body bounded on the way in."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yuzu.settings")
django_app = get_asgi_application()

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

# daphne serves no files itself: the admin's CSS and JS come from the apps' static directories.
django_app = ASGIStaticFilesHandler(django_app)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from fleet.routing import websocket_urlpatterns  # noqa: E402
from mcp.transport import BridgeConsumer, McpConsumer  # noqa: E402
from yuzu.bodylimit import BodyLimit, install_daphne  # noqa: E402
from yuzu.routing import path, re_path  # noqa: E402

# Every HTTP request body is bounded while it arrives (yuzu/bodylimit.py), under daphne before Twisted holds it.
install_daphne()
application = ProtocolTypeRouter({
    "http": BodyLimit(URLRouter([
        path("mcp/v1", McpConsumer.as_asgi()),
        path("mcp/v1/", McpConsumer.as_asgi()),
        path("mcp/bridge", BridgeConsumer.as_asgi()),
        path("mcp/bridge/", BridgeConsumer.as_asgi()),
        re_path(r"", django_app),
    ])),
    "websocket": URLRouter(websocket_urlpatterns),
})
