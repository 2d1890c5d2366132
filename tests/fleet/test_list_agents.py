"""fleet.services.list_agents: what it answers is what the ORM's own reading of the same rows answers — fields,
order, filters, limit — and a reader confined to management groups sees only their agents (or none), whatever
the fleet-wide query that was compiled before."""

from datetime import UTC, datetime

from fleet import services
from fleet.models import Agent, ManagementGroup

SEEN = datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)


def orm_view(qs):
    """The rows as the ORM reads them (Django's own converters), shown as the API shows an agent."""
    return [services.agent_view(row) for row in qs.order_by("agent_id").values(*services.AGENT_FIELDS)]


def fleet(n=6):
    for i in range(n):
        Agent.objects.create(agent_id=f"a{i}", hostname=f"host-{i}", os="linux" if i % 2 else "windows",
                             arch="x86_64", agent_version="1.0", connected=i % 3 == 0,
                             last_seen=None if i == 4 else SEEN, quarantined=i == 5)


def test_fleet_wide_reader_gets_every_agent_as_the_orm_reads_it(principal):
    fleet()
    p = principal("viewer", role="Viewer")
    rows = services.list_agents(p)
    assert rows == orm_view(Agent.objects.all())
    assert [r["agent_id"] for r in rows] == ["a0", "a1", "a2", "a3", "a4", "a5"]
    assert rows[0]["last_seen"] == "2026-03-04T05:06:07.891011+00:00" and rows[4]["last_seen"] is None
    assert rows[0]["connected"] is True and rows[1]["connected"] is False and rows[5]["quarantined"] is True
    assert services.list_agents(p, connected=True) == orm_view(Agent.objects.filter(connected=True))
    assert services.list_agents(p, connected=False) == orm_view(Agent.objects.filter(connected=False))
    assert [r["agent_id"] for r in services.list_agents(p, limit=2)] == ["a0", "a1"]
    Agent.objects.filter(pk="a1").update(connected=True, hostname="renamed")  # compiled once, read every call
    assert services.list_agents(p, connected=True) == orm_view(Agent.objects.filter(connected=True))
    assert "renamed" in {r["hostname"] for r in services.list_agents(p)}


def test_group_confined_reader_sees_only_its_groups_agents(principal):
    fleet()
    static = ManagementGroup.objects.create(name="static")
    static.members.add("a1", "a2")
    dynamic = ManagementGroup.objects.create(name="dyn", membership_type=ManagementGroup.Membership.DYNAMIC,
                                             scope_expression="hostname == host-3")
    fleet_wide = principal("global", role="Viewer")
    services.list_agents(fleet_wide)  # the fleet-wide query compiled first: confinement must not reuse it
    on_static = principal("s", role="Viewer", group=static)
    assert [r["agent_id"] for r in services.list_agents(on_static)] == ["a1", "a2"]
    assert services.list_agents(on_static) == orm_view(Agent.objects.filter(pk__in=["a1", "a2"]))
    assert [r["agent_id"] for r in services.list_agents(on_static, connected=False)] == ["a1", "a2"]
    assert services.list_agents(on_static, connected=True) == []
    on_dynamic = principal("d", role="Viewer", group=dynamic)
    assert [r["agent_id"] for r in services.list_agents(on_dynamic)] == ["a3"]


def test_reader_without_infrastructure_grant_anywhere_sees_none(principal):
    fleet()
    nobody = principal("nobody", role=None)
    assert services.list_agents(nobody) == []


def test_any_text_and_any_insertion_order_come_back_as_the_orm_reads_them(principal):
    """On SQLite the list is read as one JSON array (fleet/services.py): every character survives it, and the rows
    come back in the query's order whatever order they were written in, the limit taking the first of that order."""
    names = ['quote " and \\ backslash', "tab\tnew\nline", "é ü 中文 🚀", "\u2028\u2029", "", "x" * 255]
    ids = ["zeta", "Alpha", "beta", "émile", "0-first", "_under"]
    for agent_id, hostname in zip(ids, names, strict=True):  # written in an order that is not the query's
        Agent.objects.create(agent_id=agent_id, hostname=hostname, os="linux", arch="arm64", agent_version="2",
                             connected=agent_id < "b", last_seen=SEEN if agent_id != "beta" else None)
    p = principal("viewer", role="Viewer")
    assert services.list_agents(p) == orm_view(Agent.objects.all())
    assert {r["hostname"] for r in services.list_agents(p)} == set(names)
    assert services.list_agents(p, limit=3) == orm_view(Agent.objects.all())[:3]
    assert services.list_agents(p, connected=True, limit=2) == orm_view(Agent.objects.filter(connected=True))[:2]
