"""yuzu.dbfuncs.IsoUtc: the database writes a timestamp exactly as ``datetime.isoformat()`` does for an aware
UTC datetime — on whichever database the suite runs (SQLite under `make test`, PostgreSQL in CI)."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from fleet.models import Agent
from yuzu.dbfuncs import IsoUtc

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
