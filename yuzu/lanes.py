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

Two middleware chains: ``/api/`` requests take settings.API_MIDDLEWARE (without the admin pages' session, CSRF,
user, OTP and messages middleware, which the REST face does not use), every other request settings.MIDDLEWARE.
"""

import asyncio
import os
from typing import Any

from asgiref.sync import SyncToAsync, ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.http import HttpResponseBase
from django.urls import set_script_prefix

DEFAULT_SIZE = int(os.environ.get("YUZU_HTTP_THREADS", "8"))


class Chain(BaseHandler):
    """Django's middleware chain of the list ``middleware``, built for sync use as under WSGI (not ASGIHandler's
    async one), so that a request's sync work runs in one hop to its lane (LaneHandler.handle). Built async, every
    sync-only middleware (ours, OTP's) made asgiref hop back to the event loop and out to a thread again for the
    view."""

    def __init__(self, middleware: list[str]) -> None:
        super().__init__()
        whole = settings.MIDDLEWARE
        settings.MIDDLEWARE = middleware  # Django builds a chain from this setting only: read once, here
        try:
            self.load_middleware(is_async=False)
        finally:
            settings.MIDDLEWARE = whole


class LaneHandler(ASGIHandler):
    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        BaseHandler.__init__(self)  # (not ASGIHandler's: its async chain is not used)
        self.pages = Chain(settings.MIDDLEWARE)
        self.api = Chain(settings.API_MIDDLEWARE)
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

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        """Django's ``ASGIHandler.handle`` with one thread hop per request instead of five: request_started, the
        middleware chain and the view, and the response's close (request_finished) all run in ``respond`` on the
        lane; only the body's arrival and the sending stay on the event loop. (A streamed response is closed
        after it was sent, as Django does.) What this leaves out of Django's: cancelling the view when the client
        disconnects — a sync view runs to its end on its thread either way."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        try:
            response = await sync_to_async(self.respond, thread_sensitive=True)(scope, body_file)
            await self.send_response(response, send)
            if response.streaming:
                await sync_to_async(response.close, thread_sensitive=True)()
        finally:
            body_file.close()

    def respond(self, scope: Any, body_file: Any) -> HttpResponseBase:
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = (self.api if request.path_info.startswith("/api/") else self.pages).get_response(request)
            response._handler_class = self.__class__  # type: ignore[attr-defined]  # (Django's own marker)
        assert response is not None
        if not response.streaming:
            response.close()  # its content is built; request_finished: Django's connection hygiene, on this thread
        return response
