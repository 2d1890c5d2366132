"""Health, readiness and metrics."""

from functools import cache

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@cache
def _redis(url: str) -> redis.Redis:
    """One client per process (its pool keeps the connection): /readyz is anonymous, and a client per request
    opened a connection per request — a probe loop, or anyone, churned Redis's connections."""
    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)


def readyz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception:
        checks["database"] = "unavailable"
    if settings.REDIS_URL:
        try:
            _redis(settings.REDIS_URL).ping()
            checks["redis"] = "ok"
        except Exception:
            checks["redis"] = "unavailable"
    ready = all(v == "ok" for v in checks.values())
    return JsonResponse({"status": "ready" if ready else "not_ready", "checks": checks}, status=200 if ready else 503)


def metrics(request: HttpRequest) -> HttpResponse:
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)
