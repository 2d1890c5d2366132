"""yuzu.dbfuncs on whichever database the suite runs (SQLite under `make test`, PostgreSQL in CI): IsoUtc writes a
timestamp exactly as ``datetime.isoformat()`` does for an aware UTC datetime; executemany runs one statement per
row of parameters, NULLs and timestamps included, in the caller's transaction, and fails as Django's errors do."""

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import IntegrityError, transaction

from fleet.models import Agent
from yuzu.dbfuncs import IsoUtc, executemany

pytestmark = pytest.mark.django_db

MOMENTS = [
    datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=UTC),
    datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC),  # no microseconds: isoformat writes no fraction
    datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(1999, 1, 2, 3, 4, 5, 120000, tzinfo=UTC),  # trailing zeros of the fraction are kept
    datetime(2026, 6, 1, 1, 30, 0, 5, tzinfo=timezone(timedelta(hours=5, minutes=30))),  # stored as UTC
]


def test_iso_utc_is_what_isoformat_writes_for_every_shape_of_timestamp():
    for i, moment in enumerate(MOMENTS):
        Agent.objects.create(agent_id=f"a{i}", last_seen=moment)
    Agent.objects.create(agent_id="never", last_seen=None)
    got = dict(Agent.objects.annotate(iso=IsoUtc("last_seen")).values_list("agent_id", "iso"))
    assert got == {**{f"a{i}": m.astimezone(UTC).isoformat() for i, m in enumerate(MOMENTS)}, "never": None}
    assert got["a1"] == "2026-03-04T05:06:07+00:00" and got["a4"] == "2026-05-31T20:00:00.000005+00:00"


def test_executemany_runs_the_statement_for_every_row_in_the_callers_transaction():
    for agent_id in ("b1", "b2", "b3"):
        Agent.objects.create(agent_id=agent_id, hostname="old", connected=True)
    seen = datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)
    update = "UPDATE fleet_agent SET hostname = %s, last_seen = COALESCE(last_seen, %s) WHERE agent_id = %s"
    executemany(update, [("one", seen, "b1"), ("two", None, "b2")])
    rows = dict(Agent.objects.values_list("agent_id", "hostname"))
    assert rows == {"b1": "one", "b2": "two", "b3": "old"}
    assert Agent.objects.get(pk="b1").last_seen == seen and Agent.objects.get(pk="b2").last_seen is None
    with pytest.raises(IntegrityError), transaction.atomic():  # hostname is NOT NULL: Django's error, all undone
        executemany(update, [("three", None, "b3"), (None, None, "b1")])
    assert Agent.objects.get(pk="b3").hostname == "old"
