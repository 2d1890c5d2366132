"""yuzu.backends.postgresql: a kept connection is checked without a round trip, and a connection the server
closed is still found unusable and replaced before a request uses it. The server binds the parameters and a
statement a connection runs often is prepared (yuzu/settings.py)."""

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


def test_the_server_binds_parameters_and_a_statement_run_often_is_prepared():
    """What every call's auth version, list and audit INSERT rely on: parsed and planned once per connection."""
    sql = "SELECT n FROM yuzu_authversion WHERE id = %s"

    def prepared():
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement = %s",
                           [sql.replace("%s", "$1")])
            return cursor.fetchone()[0]

    for _ in range(4):
        with connection.cursor() as cursor:
            cursor.execute(sql, [1])
    assert prepared() == 0  # bound by the server ($1), not yet prepared
    for _ in range(2):
        with connection.cursor() as cursor:
            cursor.execute(sql, [1])
    assert prepared() == 1
