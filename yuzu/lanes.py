"""Django's HTTP requests on a fixed set of long-lived threads ("lanes") instead of a new thread per request.

Django's ``ASGIHandler`` runs each request's sync code (middleware, DRF views) in a ``ThreadSensitiveContext``
of its own: a fresh one-thread executor per request, so a fresh thread — and, with connections kept per thread,
a fresh database connection (PostgreSQL: a connect and authentication per ``GET /api/v1/agents``, and "too many
clients" under concurrent load; SQLite: a file open and the PRAGMAs). ``LaneHandler`` hands each request one of
``size`` long-lived contexts instead: the request's sync code still runs on one thread that no other request
uses at the same time (what thread sensitivity promises), and that thread's database connection is reused
(``CONN_MAX_AGE``, checked by ``CONN_HEALTH_CHECKS`` as before). At most ``size`` requests of a process run their
sync code at once; the others wait for a free lane on the event loop.

Where an outer ``async_to_sync`` already pins sync code to its thread (in-process tests), asgiref runs it there,
as before: the lane is not used.
"""

import asyncio
import os
from typing import Any

from asgiref.sync import SyncToAsync, ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.http import HttpRequest, HttpResponseBase

DEFAULT_SIZE = int(os.environ.get("YUZU_HTTP_THREADS", "8"))


class LaneHandler(ASGIHandler):
    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        # The middleware chain built for sync use, as under WSGI (not ASGIHandler's async one): run on the lane
        # in one hop (get_response_async below). Built async, every sync-only middleware (ours, OTP's) makes
        # asgiref hop back to the event loop and out to the thread again for the view — three thread hops per
        # request instead of one.
        BaseHandler.__init__(self)
        self.load_middleware(is_async=False)
        self.size = max(1, size)
        self._free: asyncio.Queue[ThreadSensitiveContext] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        if self._free is None:  # created on the server's event loop
            self._free = asyncio.Queue()
            for _ in range(self.size):
                self._free.put_nowait(ThreadSensitiveContext())
        lane = await self._free.get()
        token = SyncToAsync.thread_sensitive_context.set(lane)
        try:
            await self.handle(scope, receive, send)
        finally:
            SyncToAsync.thread_sensitive_context.reset(token)
            self._free.put_nowait(lane)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        """The whole sync chain — middleware, URL resolution, the view — in one hop to the request's lane."""
        response: HttpResponseBase = await sync_to_async(self.get_response, thread_sensitive=True)(request)
        return response
