"""Schedules (next run in a time zone, coalescing, the approval pinned to targets, bad input) and the typed
software inventory and licences (paged reports, hash-skip, version comparison, confinement, no user_ref on MCP)."""

from datetime import UTC, datetime, timedelta
from functools import partial

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone
from prometheus_client import REGISTRY

from approvals.models import Approval
from fleet.models import Agent, Execution, InstructionDefinition, ManagementGroup
from operations import inventory, schedules
from operations.models import DetectedLicense, InstalledSoftware, InstructionSchedule, InventoryState
from tests.operations.conftest import Caller
from tests.support.agent_ws import enrolled_agent, mint_device_token, until
from tests.support.races import at_once
from yuzu.models import AuditEvent
from yuzu.rbac import Principal

pytestmark = pytest.mark.django_db
HASH = "a" * 64


def test_next_run_reads_time_of_day_in_the_schedule_time_zone():
    s = InstructionSchedule(frequency_type="daily", time_of_day="09:30", time_zone="Europe/Paris")
    assert s.next_after(datetime(2026, 7, 1, 6, 0, tzinfo=UTC)) == datetime(2026, 7, 1, 7, 30, tzinfo=UTC)
    assert s.next_after(datetime(2026, 12, 1, 9, 0, tzinfo=UTC)) == datetime(2026, 12, 2, 8, 30, tzinfo=UTC)
    weekly = InstructionSchedule(frequency_type="weekly", time_of_day="00:00", day_of_week=0)  # Sunday
    assert weekly.next_after(datetime(2026, 12, 1, tzinfo=UTC)).weekday() == 6
    monthly = InstructionSchedule(frequency_type="monthly", time_of_day="12:00", day_of_month=28)
    assert monthly.next_after(datetime(2026, 2, 28, 13, 0, tzinfo=UTC)) == datetime(2026, 3, 28, 12, 0, tzinfo=UTC)
    assert InstructionSchedule(frequency_type="interval", interval_minutes=5).next_after(
        datetime(2026, 1, 1, tzinfo=UTC)) == datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
    assert InstructionSchedule(frequency_type="once").next_after(timezone.now()) is None


@pytest.fixture
def definition(db):
    return InstructionDefinition.objects.create(id="up", name="uptime", plugin="system", action="uptime")


@pytest.mark.parametrize(("body", "needle"), [
    ({"definition_id": "nope", "frequency_type": "interval"}, "unknown definition"),
    ({"definition_id": "up", "frequency_type": "daily"}, "time_of_day"),
    ({"definition_id": "up", "frequency_type": "once", "start_at": "2001-01-01T00:00:00Z"}, "past"),
    ({"definition_id": "up", "frequency_type": "once"}, "needs start_at"),
    # a month 13 raised ValueError from the parser (a 500); year 10000 once in UTC failed at the write
    ({"definition_id": "up", "frequency_type": "once", "start_at": "2100-13-01T00:00:00Z"}, "start_at must be"),
    ({"definition_id": "up", "frequency_type": "once", "start_at": "9999-12-31T23:59:59-14:00"}, "start_at must be"),
    ({"definition_id": "up", "frequency_type": "once", "start_at": "2100-01-01T00:00:00"}, "with a zone"),
    ({"definition_id": "up", "frequency_type": "daily", "time_of_day": "10:00", "time_zone": "Mars/Base"},
     "time_zone"),
    ({"definition_id": "up", "frequency_type": "interval", "scope_expression": "ostype =="}, "scope"),
])
def test_bad_schedules_are_refused_and_nothing_is_written(agent, definition, principal, body, needle):
    with pytest.raises(Exception) as exc:
        schedules.create_schedule(principal("boss", "Administrator"), {"name": "x", **body})
    assert needle in str(exc.value)
    assert not InstructionSchedule.objects.exists() and not Approval.objects.exists()


def test_a_supervised_schedule_fires_only_once_approved_on_its_pinned_targets(agent, definition, mint):
    raw = mint("sup", role="Administrator", tier="supervised")
    from yuzu.models import ApiToken
    token = ApiToken.objects.get(owner__username="sup")
    p = Principal(user=token.owner, token=token)
    row = schedules.create_schedule(p, {"name": "s", "definition_id": "up", "frequency_type": "interval",
                                        "interval_minutes": 1})
    assert raw and row["approval_state"] == "pending"
    ticket = Approval.objects.get(pk=row["approval_id"])
    assert ticket.pins == {"agents": ["a1"]} and ticket.submitted_by == "sup"
    Agent.objects.create(agent_id="a2", hostname="a2", os="linux", connected=True)  # arrives later: not pinned
    assert schedules.tick() == 1 and not Execution.objects.exists()
    Approval.objects.filter(pk=ticket.pk).update(status=Approval.APPROVED)
    schedules.tick()
    ex = Execution.objects.get()
    assert ex.dispatched_by == f"schedule:{row['id']}" and ex.agents_targeted == 1
    Approval.objects.filter(pk=ticket.pk).update(status=Approval.REJECTED)  # approved once is enough
    InstructionSchedule.objects.filter(pk=row["id"]).update(next_execution_at=timezone.now())
    schedules.tick()
    assert Execution.objects.count() == 2


def test_missed_runs_coalesce_into_one(agent, definition, principal):
    row = schedules.create_schedule(principal("boss", "Administrator"), {
        "name": "s", "definition_id": "up", "frequency_type": "interval", "interval_minutes": 1})
    InstructionSchedule.objects.filter(pk=row["id"]).update(next_execution_at=timezone.now() - timedelta(hours=5))
    schedules.tick()
    schedules.tick()
    assert Execution.objects.count() == 1
    assert InstructionSchedule.objects.get(pk=row["id"]).next_execution_at > timezone.now()


@pytest.mark.django_db(transaction=True)
def test_enabling_a_schedule_while_a_tick_fires_it_does_not_make_it_fire_again(agent, definition, principal):
    """enable_schedule read the row, then wrote its next run as read: a tick that fired the schedule meanwhile had
    moved the next run an interval on, and the stale write put it back in the past — the next tick fired it
    again, two runs in one interval."""
    boss = principal("boss", "Administrator")
    row = schedules.create_schedule(boss, {"name": "s", "definition_id": "up", "frequency_type": "interval",
                                           "interval_minutes": 60})
    for n in range(1, 11):  # the second run showed in a third of the rounds on PostgreSQL
        InstructionSchedule.objects.filter(pk=row["id"]).update(next_execution_at=timezone.now() - timedelta(seconds=1))
        outcomes = at_once(schedules.tick, partial(schedules.enable_schedule, boss, row["id"], True))
        assert [kind for kind, _ in outcomes] == ["ok", "ok"], outcomes
        schedules.tick()  # whether the racing tick fired it or skipped the locked row, this makes one run in all
        assert Execution.objects.count() == n
        assert InstructionSchedule.objects.get(pk=row["id"]).next_execution_at > timezone.now()


def test_list_schedules_tool(agent, definition, principal, mcp):
    schedules.create_schedule(principal("boss", "Administrator"), {
        "name": "s", "definition_id": "up", "frequency_type": "daily", "time_of_day": "03:00"})
    out, _ = mcp("Viewer", "readonly").tool("list_schedules", {})
    [s] = out["schedules"]
    assert s["name"] == "s" and s["frequency_type"] == "daily" and s["next_execution_at"]


# --- software inventory ----------------------------------------------------------------------------------

def pkg(name, version, source="dpkg"):
    return {"name": name, "version": version, "publisher": "Debian", "install_date": "2026-01-01", "source": source}


def test_paged_reports_replace_in_full_and_hash_skip_asks_for_a_resync(agent):
    assert inventory.receive_software("a1", {"hash": HASH, "page": 0, "pages": 2,
                                             "packages": [pkg("openssl", "3.0.2-1")]}) is None
    assert not InstalledSoftware.objects.exists()  # nothing until the last page
    inventory.receive_software("a1", {"hash": HASH, "page": 1, "pages": 2, "packages": [pkg("bash", "5.2-1")]})
    assert set(InstalledSoftware.objects.values_list("name", flat=True)) == {"openssl", "bash"}
    assert inventory.receive_software("a1", {"hash": HASH}) is None
    assert inventory.receive_software("a1", {"hash": "b" * 64}) == {"type": "software.resync"}
    inventory.receive_software("a1", {"hash": "c" * 64, "page": 0, "pages": 1, "packages": [pkg("bash", "5.3-1")]})
    assert list(InstalledSoftware.objects.values_list("name", "version")) == [("bash", "5.3-1")]
    assert InventoryState.objects.get(agent_id="a1", source="software").content_hash == "c" * 64
    for bad in ({"hash": "x"}, {"hash": HASH, "page": 3, "pages": 2, "packages": []},
                {"hash": HASH, "page": 0, "pages": 1, "packages": [pkg("x", "1", "brew")]},
                {"hash": HASH, "page": 0, "pages": 1, "packages": [{"name": "x\x00", "source": "dpkg"}]}):
        with pytest.raises(inventory.Malformed):
            inventory.receive_software("a1", bad)
    assert InstalledSoftware.objects.count() == 1


def syncs(outcome):
    return REGISTRY.get_sample_value("yuzu_software_inventory_syncs_total",
                                     {"source": "software", "outcome": outcome}) or 0.0


@pytest.fixture
def no_staging():
    inventory._staged.clear()
    yield
    inventory._staged.clear()


def test_a_list_over_the_row_cap_is_refused_while_it_arrives_and_the_stored_rows_kept(agent, no_staging,
                                                                                     monkeypatch):
    """The cap applies while pages are staged, not only once a list is complete: an agent that sends 63 of 64
    pages holds at most MAX_ROWS rows in the server's memory, and its refused list stays refused."""
    monkeypatch.setattr(inventory, "MAX_ROWS", 5)
    inventory.receive_software("a1", {"hash": "c" * 64, "page": 0, "pages": 1, "packages": [pkg("bash", "5.3-1")]})
    before = syncs("too_many_rows")
    page = [pkg(f"p{i}", "1") for i in range(3)]
    inventory.receive_software("a1", {"hash": HASH, "page": 0, "pages": 4, "packages": page})
    assert inventory._staged["a1"].rows == 3
    inventory.receive_software("a1", {"hash": HASH, "page": 1, "pages": 4, "packages": page})  # 6 > 5
    assert syncs("too_many_rows") == before + 1
    assert inventory._staged["a1"].pages == {} and inventory._staged["a1"].refused
    for i in (2, 3):  # the rest of the refused list is dropped as it comes, even its last page
        inventory.receive_software("a1", {"hash": HASH, "page": i, "pages": 4, "packages": page})
    assert inventory._staged["a1"].pages == {} and syncs("too_many_rows") == before + 1
    assert list(InstalledSoftware.objects.values_list("name", flat=True)) == ["bash"]  # what was stored stays
    inventory.receive_software("a1", {"hash": "d" * 64, "page": 0, "pages": 1, "packages": page})  # a new list
    assert InstalledSoftware.objects.count() == 3 and "a1" not in inventory._staged


def test_staged_pages_expire_and_go_when_the_agent_disconnects(agent, no_staging):
    first = {"hash": HASH, "page": 0, "pages": 2, "packages": [pkg("bash", "5.2-1")]}
    inventory.receive_software("a1", first)
    inventory._staged["a1"].touched -= inventory.STAGE_TTL_S + 1
    expired = syncs("expired")
    inventory.receive_software("b2", first)  # any page sweeps what has gone stale
    assert "a1" not in inventory._staged and syncs("expired") == expired + 1
    abandoned = syncs("abandoned")
    inventory.forget_staged("b2")
    assert not inventory._staged and syncs("abandoned") == abandoned + 1


def staged_for(agent_id):
    return any(agent_id == (key[0] if isinstance(key, tuple) else key) for key in inventory._staged)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("eager_celery")
def test_an_agent_that_disconnects_mid_list_leaves_nothing_staged(no_staging):
    """Over a real agent WebSocket: pages of a list that will never be finished go with the connection."""
    token = mint_device_token()

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        await comm.send_json_to({"type": "report", "kind": "software", "report": {
            "hash": HASH, "page": 0, "pages": 64, "packages": [pkg("bash", "5.2-1")]}})
        await until(lambda: staged_for(agent_id))
        await comm.disconnect()
        return agent_id

    agent_id = async_to_sync(scenario)()
    assert not staged_for(agent_id)
    assert not Agent.objects.get(pk=agent_id).connected


def test_version_comparison_is_dpkg_like():
    key = inventory.version_key
    assert key("1.0~rc1") < key("1.0") < key("1.0.1") < key("1.10") < key("1:0.1")
    assert key("3.0.2-0ubuntu1.10") > key("3.0.2-0ubuntu1.9")
    assert key("²:1.0") == key("1.0")  # an epoch str.isdigit() admits but int() refuses (an agent's text)


def test_a_schedule_id_int_cannot_read_is_not_found(principal):
    with pytest.raises(Exception, match="Schedule not found"):
        schedules.delete_schedule(principal("boss", "Administrator"), "²")


def test_query_filters_counts_and_confines(agent, mcp, mint):
    other = Agent.objects.create(agent_id="b2", hostname="b2", os="linux")
    g = ManagementGroup.objects.create(name="g")
    g.members.add(agent)
    inventory.receive_software("a1", {"hash": HASH, "page": 0, "pages": 1,
                                      "packages": [pkg("openssl", "3.0.2-1"), pkg("bash", "5.2")]})
    inventory.receive_software("b2", {"hash": HASH, "page": 0, "pages": 1, "packages": [pkg("openssl", "3.0.13-1")]})
    out, _ = mcp("Viewer", "readonly").tool("query_installed_software",
                                            {"name": "openssl", "version": "3.0.10", "version_op": "lt",
                                             "counts": True})
    assert [r["agent_id"] for r in out["software"]] == ["a1"]
    assert out["versions"] == [{"name": "openssl", "version": "3.0.2-1", "devices": 1}]
    confined = Caller(mint("gv", role="Viewer", tier="readonly", group=g))
    out, _ = confined.tool("query_installed_software", {"name": "openssl"})
    assert [r["agent_id"] for r in out["software"]] == ["a1"] and out["devices_omitted"] == 1
    _, error = mcp().tool("query_installed_software", {"name": "x", "version": "1"})
    assert error["code"] == -32602
    assert other.pk == "b2"


def test_a_version_too_long_to_compare_is_a_400_on_rest_as_on_mcp(agent, mint, client):
    """The tool's schema caps version at 128 characters; the REST twin passed any length on to the comparison, whose
    int() of a run of more than 4,300 digits raised — a 500 for one query parameter."""
    inventory.receive_software("a1", {"hash": HASH, "page": 0, "pages": 1, "packages": [pkg("openssl", "3.0.2-1")]})
    auth = {"HTTP_AUTHORIZATION": f"Bearer {mint('inv', role='Viewer')}"}
    r = client.get("/api/v1/inventory/software", {"name": "openssl", "version": "1" * 5000, "version_op": "lt"},
                   **auth)
    assert r.status_code == 400, r.content
    assert "version" in r.json()["error"]["message"]
    r = client.get("/api/v1/inventory/software", {"name": "openssl", "version": "3.0.10", "version_op": "lt"}, **auth)
    assert r.status_code == 200 and [s["agent_id"] for s in r.json()["data"]["software"]] == ["a1"]


def test_licences_per_device_never_user_ref_on_mcp(agent, mcp, mint):
    inventory.receive_licenses("a1", {"licenses": [{
        "product": "rhel", "vendor": "Red Hat", "version": "9", "license_type": "subscription",
        "state": "subscription_active", "channel": "entitlement", "expiry_at": 1893456000,
        "detector": "entitlement_cert", "confidence": "authoritative", "key_hint": "ab12", "exe_hints": []}]})
    DetectedLicense.objects.update(user_ref="alice")
    out, _ = mcp().tool("query_software_licenses", {"agent_id": "a1"})
    assert out["count"] == 1 and "user_ref" not in out["licenses"][0]
    assert mcp().tool("query_software_licenses", {"agent_id": "nope"})[0] == {"agent_id": "nope", "count": 0,
                                                                              "licenses": []}
    with pytest.raises(inventory.Malformed):
        inventory.receive_licenses("a1", {"licenses": [{"product": "x", "license_type": "stolen", "state": "unknown",
                                                        "detector": "heuristic", "confidence": "heuristic"}]})
    assert DetectedLicense.objects.count() == 1


def test_a_schedules_secret_parameters_are_never_shown(agent, definition, principal, mint, client, make_user):
    """A schedule keeps its parameters to replay them at each run, but a parameter whose name marks a secret is
    shown as [redacted] — as an execution's are — to every reader: REST, the MCP-tier token over REST, the admin.
    It was returned in clear to any Schedule:Read holder (every Viewer)."""
    from tests.compliance.test_admin import admin_session

    row = schedules.create_schedule(principal("boss", "Administrator"), {
        "name": "nightly", "definition_id": "up", "frequency_type": "daily", "time_of_day": "03:00",
        "parameters": {"db_password": "hunter2-pw", "api.token": "hunter2-tok", "path": "/var/log"}})
    assert row["parameters"] == {"db_password": "[redacted]", "api.token": "[redacted]", "path": "/var/log"}
    r = client.get("/api/v1/schedules", HTTP_AUTHORIZATION=f"Bearer {mint('v', role='Viewer', tier='readonly')}")
    assert r.status_code == 200 and b"hunter2" not in r.content
    assert r.json()["data"]["schedules"][0]["parameters"]["path"] == "/var/log"
    page = admin_session(make_user, "staff-viewer", "Viewer").get(
        f"/admin/operations/instructionschedule/{row['id']}/change/")
    assert page.status_code == 200 and b"hunter2" not in page.content and b"[redacted]" in page.content
    assert not AuditEvent.objects.filter(detail__contains="hunter2").exists()
    # no column holds it in clear; what runs is the real value
    stored = InstructionSchedule.objects.get(pk=row["id"])
    assert stored.parameters["db_password"] == "[redacted]" and b"hunter2" not in bytes(stored.secrets_sealed)
    assert stored.run_parameters() == {"db_password": "hunter2-pw", "api.token": "hunter2-tok", "path": "/var/log"}


def sent_secrets(monkeypatch):
    """What each launch hands its dispatch task (the secret values travel only there)."""
    from fleet import executions

    sent = []
    monkeypatch.setattr(executions, "_enqueue", lambda execution_id, sensitive: sent.append(sensitive))
    return sent


def test_a_run_sends_the_sealed_secret_and_stores_it_nowhere_in_clear(agent, definition, principal, monkeypatch,
                                                                     django_capture_on_commit_callbacks):
    sent = sent_secrets(monkeypatch)
    schedules.create_schedule(principal("boss", "Administrator"), {
        "name": "s", "definition_id": "up", "frequency_type": "interval", "interval_minutes": 1,
        "parameters": {"db_password": "hunter2-pw", "path": "/var/log"}})
    with django_capture_on_commit_callbacks(execute=True):  # the dispatch follows the rows' commit
        schedules.tick()
    assert sent == [{"db_password": "hunter2-pw"}]
    assert Execution.objects.get().parameter_values == {"db_password": "[redacted]", "path": "/var/log"}


@pytest.mark.django_db(transaction=True)
def test_the_migration_seals_the_secrets_of_existing_schedules():
    """operations 0003: a schedule written before secrets were sealed keeps its runs' values, none in clear."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = [("operations", "0002_kill_switch_per_group")], [("operations", "0003_schedule_secrets_sealed")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    Old = executor.loader.project_state(before).apps.get_model("operations", "InstructionSchedule")
    old = Old.objects.create(name="s", definition_id="up", frequency_type="interval", created_by="boss",
                             creator_key="k", parameters={"db_password": "hunter2-pw", "path": "/var/log"})
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(after)
    stored = InstructionSchedule.objects.get(pk=old.pk)
    assert stored.parameters == {"db_password": "[redacted]", "path": "/var/log"}
    assert b"hunter2" not in bytes(stored.secrets_sealed)
    assert stored.run_parameters() == {"db_password": "hunter2-pw", "path": "/var/log"}


def test_a_secret_that_cannot_be_unsealed_sends_nothing(agent, definition, principal, monkeypatch):
    sent = sent_secrets(monkeypatch)
    row = schedules.create_schedule(principal("boss", "Administrator"), {
        "name": "s", "definition_id": "up", "frequency_type": "interval", "interval_minutes": 1,
        "parameters": {"db_password": "hunter2-pw"}})
    blob = bytearray(InstructionSchedule.objects.get(pk=row["id"]).secrets_sealed)
    blob[-1] ^= 1  # tampered with (or sealed under a key that is gone)
    InstructionSchedule.objects.filter(pk=row["id"]).update(secrets_sealed=bytes(blob))
    schedules.tick()
    stored = InstructionSchedule.objects.get(pk=row["id"])
    assert sent == [] and not Execution.objects.exists()
    assert stored.last_error.startswith("its secret parameters cannot be unsealed")


def test_a_locked_creators_schedule_skips_its_runs_and_fires_again_once_unlocked(agent, definition, principal,
                                                                                  make_user):
    """A schedule runs with its creator's rights as they stand now: while an administrator's lock holds the creator
    out, nothing runs as them — but the lock is no revocation, so the schedule stays enabled (a deactivated creator
    disables it, as a revoked token does) and fires again once the lock is lifted."""
    from yuzu.accounts import lock_account, unlock_account

    row = schedules.create_schedule(principal("boss", "Administrator"), {
        "name": "s", "definition_id": "up", "frequency_type": "interval", "interval_minutes": 1})
    root = Principal(user=make_user("root", superuser=True), via="session")
    lock_account(root, "boss", timezone.now() + timedelta(hours=1))
    InstructionSchedule.objects.filter(pk=row["id"]).update(next_execution_at=timezone.now() - timedelta(seconds=1))
    schedules.tick()
    stored = InstructionSchedule.objects.get(pk=row["id"])
    assert not Execution.objects.exists()
    assert stored.enabled and "locked by an administrator" in stored.last_error
    assert stored.next_execution_at > timezone.now()
    unlock_account(root, "boss")
    InstructionSchedule.objects.filter(pk=row["id"]).update(next_execution_at=timezone.now() - timedelta(seconds=1))
    schedules.tick()
    assert Execution.objects.count() == 1 and InstructionSchedule.objects.get(pk=row["id"]).last_error == ""
