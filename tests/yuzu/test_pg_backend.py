"""yuzu.backends.postgresql: a kept connection is checked without a round trip, and a connection the server
closed is still found unusable and replaced before a request uses it."""

import time

import psycopg
import pytest
from django.conf import settings
from django.db import close_old_connections, connection
from django.db.backends.postgresql import base as django_pg

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not settings.DATABASE_IS_POSTGRES, reason="the PostgreSQL backend: YUZU_DATABASE_URL unset"),
]


def backend_pid():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def test_a_kept_healthy_connection_is_checked_without_a_query(monkeypatch):
    pid = backend_pid()
    asked = []
    monkeypatch.setattr(django_pg.DatabaseWrapper, "is_usable", lambda self: asked.append(1) or True)
    assert connection.is_usable() and asked == []  # nothing on the socket: no SELECT 1
    close_old_connections()  # a request ends and the next begins: the health check is due again
    assert backend_pid() == pid and asked == []  # the same connection, still no round trip


def test_a_connection_the_server_closed_is_replaced_before_the_next_request_uses_it():
    pid = backend_pid()
    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k in ("dbname", "user", "password", "host", "port")},
                         autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    for _ in range(50):  # the FATAL message and the close reach the socket
        if not connection.is_usable():
            break
        time.sleep(0.05)
    assert not connection.is_usable()
    close_old_connections()  # the next request
    assert backend_pid() != pid  # a fresh connection, and no error on the way
