"""yuzu.dbfuncs on whichever database the suite runs (SQLite under `make test`, PostgreSQL in CI): IsoUtc writes a
timestamp exactly as ``datetime.isoformat()`` does for an aware UTC datetime; executemany runs one statement per
row of parameters, NULLs and timestamps included, in the caller's transaction, and fails as Django's errors do;
insert_many stores rows as the ORM would, every field not given at its default."""

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import IntegrityError, transaction
from django.forms.models import model_to_dict

from compliance.models import GuardianEvent
from fleet.models import Agent
from yuzu.dbfuncs import IsoUtc, executemany, insert_many

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


def test_insert_many_stores_what_the_orm_would_with_every_other_field_at_its_default():
    by_orm = Agent.objects.create(agent_id="orm", hostname="h-orm")
    insert_many(Agent, ["agent_id", "hostname"], [("d1", "h-1"), ("d2", "h-2")])
    stored = {a.agent_id: a for a in Agent.objects.filter(agent_id__in=["d1", "d2"])}
    assert {k: a.hostname for k, a in stored.items()} == {"d1": "h-1", "d2": "h-2"}

    def rest(agent):  # everything but the given fields and the one clock-made default
        return {k: v for k, v in model_to_dict(agent).items() if k not in ("agent_id", "hostname", "enrolled_at")}

    assert rest(stored["d1"]) == rest(stored["d2"]) == rest(by_orm)
    assert stored["d1"].enrolled_at is not None
    with pytest.raises(IntegrityError), transaction.atomic():  # d1 exists: Django's error, nothing of it kept
        insert_many(Agent, ["agent_id", "hostname"], [("d3", "h-3"), ("d1", "again")])
    assert not Agent.objects.filter(agent_id="d3").exists()


def test_insert_many_calls_a_callable_default_for_each_row_a_generated_primary_key_included():
    Agent.objects.create(agent_id="g1", hostname="g1")
    insert_many(GuardianEvent, ["agent_id", "event_type"], [("g1", "first"), ("g1", "second")])
    events = list(GuardianEvent.objects.order_by("event_type"))
    assert [e.event_type for e in events] == ["first", "second"]
    assert len({e.event_id for e in events}) == 2 and all(len(e.event_id) == 32 for e in events)  # hex32 per row
    assert all(e.detail_json == {} and e.timestamp is not None for e in events)
