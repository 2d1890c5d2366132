"""Database expressions and statements the ORM lacks."""

from collections.abc import Sequence
from typing import Any

import psycopg
from django.db import connection
from django.db.models import CharField, Func, Model
from django.db.models.fields import AutoFieldMixin


def executemany(sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """Run one statement (``%s`` placeholders) once per row of parameters. On PostgreSQL the parameters are bound on
    the server: the statement is parsed and planned once and prepared, and no row is quoted into SQL text by Python,
    as Django's client-side-binding cursor does for every row (1,000 UPDATEs of a response batch: half the client
    CPU, a third of the time). Not in Django's query log."""
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql":
            cursor.executemany(sql, rows)
            return
        with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as bound:
            bound.executemany(sql, rows)


def insert_many(model: type[Model], fields: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """INSERT one ``model`` row per item of ``rows`` (the values of ``fields``, in order, as the database takes
    them); every other field gets its default as ``save()`` would — a constant prepared once for all rows, a
    callable (a generated id, the time) called for each row — except a primary key the database generates.
    ``bulk_create`` builds a model instance and prepares every field of every row in Python: two thirds of an
    execution's start at 5,000 targets (fleet.executions.launch). No signals, no ``save()``."""
    if not rows:
        return
    named = {f.attname: f for f in model._meta.concrete_fields} | {f.name: f for f in model._meta.concrete_fields}
    given = [named[name] for name in fields]
    others = [f for f in model._meta.concrete_fields if f not in given and not isinstance(f, AutoFieldMixin)]
    constant = {f: f.get_db_prep_save(f.get_default(), connection) for f in others if not callable(f.default)}

    def defaults() -> list[Any]:
        return [constant[f] if f in constant else f.get_db_prep_save(f.get_default(), connection) for f in others]

    columns = [str(f.column) for f in given + others]
    q = connection.ops.quote_name
    executemany(f"INSERT INTO {q(model._meta.db_table)} ({', '.join(map(q, columns))}) "
                f"VALUES ({', '.join(['%s'] * len(columns))})", [(*row, *defaults()) for row in rows])


class IsoUtc(Func):
    """A timestamp column as ``datetime.isoformat()`` writes it for an aware UTC datetime
    ("2026-03-04T05:06:07.891011+00:00"; no fraction when the microseconds are 0; NULL stays NULL), formatted by
    the database. A list of rows otherwise has the driver parse every timestamp into a datetime only for Python
    to format it back: a fifth of ``list_agents``' CPU on PostgreSQL (fleet/services.py)."""

    output_field = CharField()

    function = "iso_utc_is_only_for_sqlite_and_postgresql"  # any other database refuses the query

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        # Django stores an aware datetime as naive UTC text: isoformat(" ") of it.
        return super().as_sql(compiler, connection, template="replace(%(expressions)s, ' ', 'T') || '+00:00'",
                              **extra)

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        # Only the fraction can read ".000000" (no other part has a dot).
        return super().as_sql(compiler, connection, template=(
            "replace(to_char(%(expressions)s AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US'), '.000000', '')"
            " || '+00:00'"), **extra)
