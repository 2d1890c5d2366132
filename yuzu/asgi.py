"""ASGI entry point: MCP endpoints and the agent WebSocket on Channels, everything else on Django; every HTTP
body bounded on the way in."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yuzu.settings")
django.setup(set_prefix=False)  # what get_asgi_application does, before the handler it would build

from django.core.handlers.asgi import ASGIHandler  # noqa: E402

from yuzu.lanes import LaneHandler  # noqa: E402

# Django's handler, with each request's sync code on one of a few long-lived threads (and their database
# connections) rather than a new thread per request (yuzu/lanes.py).
django_app: ASGIHandler = LaneHandler()

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

# daphne serves no files itself: the admin's CSS and JS come from the apps' static directories.
django_app = ASGIStaticFilesHandler(django_app)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from fleet.routing import websocket_urlpatterns  # noqa: E402
from mcp.transport import BridgeConsumer, McpConsumer  # noqa: E402
from yuzu.bodylimit import BodyLimit, install_daphne  # noqa: E402
from yuzu.gctune import tune  # noqa: E402
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

# Last: the start-up heap is frozen out of the cyclic GC's traversals, and young collections are rarer, so a
# process holding thousands of streams does not stop for a second every few seconds (yuzu/gctune.py).
tune()
