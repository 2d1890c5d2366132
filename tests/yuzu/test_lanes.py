"""yuzu.lanes.LaneHandler: Django's requests run their sync code on a fixed set of long-lived threads (so their
database connections are reused), one request per thread at a time, at most ``size`` at once."""

import asyncio
import threading
import time

from django.http import HttpResponse
from django.urls import path

from yuzu.lanes import LaneHandler

seen = []
running = {"now": 0, "max": 0}
lock = threading.Lock()


def view(request):
    with lock:
        running["now"] += 1
        running["max"] = max(running["max"], running["now"])
        seen.append(threading.get_ident())
    time.sleep(0.02)
    with lock:
        running["now"] -= 1
    return HttpResponse(str(threading.get_ident()))


urlpatterns = [path("lane", view)]


async def get(app):
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": "/lane", "raw_path": b"/lane", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"testserver")], "client": ("127.0.0.1", 1), "server": ("testserver", 80)}
    sent = []
    inbox = asyncio.Queue()
    inbox.put_nowait({"type": "http.request", "body": b"", "more_body": False})

    async def receive():
        return await inbox.get()

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_requests_share_a_few_long_lived_threads_one_request_each_at_a_time(settings):
    settings.ROOT_URLCONF = __name__
    settings.ALLOWED_HOSTS = ["testserver"]
    seen.clear()
    running.update(now=0, max=0)
    app = LaneHandler(size=3)

    async def go():  # no outer async_to_sync here: the lanes are what asgiref uses
        return await asyncio.gather(*(get(app) for _ in range(24)))

    results = asyncio.run(go())
    assert {status for status, _ in results} == {200}
    assert len(set(seen)) <= 3 and len(seen) == 24  # 24 requests on at most 3 threads
    assert running["max"] <= 3  # never more than one request per lane at once
    assert threading.get_ident() not in seen  # not on the caller's thread
