"""What an approval covers: the call is validated in full before a ticket exists (issue 11), the ticket
pins the targets resolved at mint time and a recall acts on those only (issue 10 item 2), the approver
and the submitter see the facts, the submitter may withdraw, and tickets past their lifetime leave the
queue on their own."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from approvals.gate import NOTHING_TO_APPROVE, UNREACHABLE
from approvals.models import APPROVAL_LIFETIME, Approval
from fleet.agent.plugins import catalogue
from fleet.models import (
    Agent,
    AgentExecStatus,
    AgentInventory,
    Execution,
    ManagementGroup,
    Tag,
)
from pki import ca
from pki.models import IssuedCert
from tests.support.approvals import approve, error_of, result_of
from yuzu.models import AuditEvent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("release_worker_connections")]


def agent(agent_id, *, connected=True, tags=None, plugins=True, **fields):
    a = Agent.objects.create(agent_id=agent_id, hostname=f"{agent_id}.example", os="linux", connected=connected,
                             **fields)
    for k, v in (tags or {}).items():
        Tag.objects.create(agent=a, key=k, value=v)
    if plugins:
        AgentInventory.objects.create(agent=a, plugin=AgentInventory.CATALOGUE, data=catalogue())
    return a


@pytest.fixture
def sup(mcp):
    return mcp("sam", role="Administrator", tier="supervised")


def ticket_of(resp):
    err = error_of(resp)
    assert err["code"] == -32006, err
    return Approval.objects.get(pk=err["data"]["approval_id"])


def targets_of(execution_id):
    return sorted(AgentExecStatus.objects.filter(execution_id=execution_id).values_list("agent_id", flat=True))


# --- issue 10 item 2: the approval covers the machines, not the scope text ------------------------

def test_recall_runs_only_on_the_agents_the_approver_saw(sup, approver):
    agent("a1", tags={"env": "test"})
    agent("a2")
    args = {"plugin": "os", "action": "info", "scope": "tag:env == test"}
    ticket = ticket_of(sup.call("execute_instruction", args))
    assert ticket.pinned_agents == ["a1"]
    approve(approver, ticket.id)
    # After approval the requester widens the scope's reach (set_tag is not gated) …
    Tag.objects.create(agent=Agent.objects.get(pk="a2"), key="env", value="test")
    agent("a3", tags={"env": "test"})
    out = result_of(sup.call("execute_instruction", {**args, "approval_id": ticket.id}))["structuredContent"]
    # … and the command reaches only the pinned agent.
    assert out["agents_reached"] == 1 and targets_of(out["execution_id"]) == ["a1"]


def test_a_pinned_agent_that_left_the_scope_is_still_the_one_approved(sup, approver):
    a1 = agent("a1", tags={"env": "test"})
    args = {"plugin": "os", "action": "info", "scope": "tag:env == test"}
    ticket = ticket_of(sup.call("execute_instruction", args))
    approve(approver, ticket.id)
    Tag.objects.filter(agent=a1).delete()
    out = result_of(sup.call("execute_instruction", {**args, "approval_id": ticket.id}))["structuredContent"]
    assert targets_of(out["execution_id"]) == ["a1"]


def test_unreachable_pinned_targets_refuse_without_consuming(sup, approver):
    agent("a1", tags={"env": "test"})
    args = {"plugin": "os", "action": "info", "scope": "tag:env == test"}
    ticket = ticket_of(sup.call("execute_instruction", args))
    approve(approver, ticket.id)
    for change in ({"connected": False}, {"quarantined": True}):
        Agent.objects.filter(pk="a1").update(**change)
        err = error_of(sup.call("execute_instruction", {**args, "approval_id": ticket.id}))
        assert err["code"] == -32003 and err["message"] == UNREACHABLE
        assert Approval.objects.get(pk=ticket.id).consumed_at is None and not Execution.objects.exists()
        Agent.objects.filter(pk="a1").update(connected=True, quarantined=False)
    out = result_of(sup.call("execute_instruction", {**args, "approval_id": ticket.id}))["structuredContent"]
    assert targets_of(out["execution_id"]) == ["a1"]


def test_a_scope_matching_nothing_mints_no_ticket(sup):
    agent("a1")
    err = error_of(sup.call("execute_instruction", {"plugin": "os", "action": "info", "scope": "tag:env == test"}))
    assert err["code"] == -32602 and err["message"] == NOTHING_TO_APPROVE
    assert not Approval.objects.exists()


def test_bundle_quarantine_and_group_tickets_pin_what_they_resolved(sup, approver):
    agent("a1")
    bundle = {"agent_id": "a1", "steps": [{"plugin": "os", "action": "info"}]}
    t = ticket_of(sup.call("execute_bundle", bundle))
    assert t.pinned_agents == ["a1"] and "os.info" in t.summary
    q = ticket_of(sup.call("quarantine_device", {"agent_id": "a1", "reason": "beaconing"}))
    assert q.pinned_agents == ["a1"] and q.risk == "destructive" and "beaconing" in q.summary
    # A group named by name is pinned by id: renamed and replaced by a namesake, the approved one is changed.
    original = ManagementGroup.objects.create(name="payments")
    g = ticket_of(sup.call("update_management_group", {"group_id": "payments", "description": "PCI hosts"}))
    assert g.pins == {"group": original.pk}
    approve(approver, g.id)
    original.name = "payments-old"
    original.save()
    impostor = ManagementGroup.objects.create(name="payments")
    result_of(sup.call("update_management_group", {"group_id": "payments", "description": "PCI hosts",
                                                   "approval_id": g.id}))
    assert ManagementGroup.objects.get(pk=original.pk).description == "PCI hosts"
    assert ManagementGroup.objects.get(pk=impostor.pk).description == ""


def test_a_role_grant_runs_only_with_the_permissions_the_approver_saw(sup, approver, make_user):
    """A role grant's ticket shows the role's permissions; the role is looked up by name at recall. Edited after the
    approval (a permission added), or renamed and replaced by a namesake, the recall granted a role the approver
    never saw. The ticket pins the role and its permissions: a changed role is refused, the ticket kept."""
    from governance import engines
    from yuzu.models import Role, RoleAssignment, RolePermission
    from yuzu.plans import Plan
    from yuzu.rbac import Principal

    make_user("bob")
    owen = make_user("owen")
    engines.create_engine_principal(Principal(user=owen), plan=Plan("", {
        "principal_id": "engine:bot", "display_name": "bot", "owner_username": "owen", "justification": "j",
        "classification": "internal"}))
    group = ManagementGroup.objects.create(name="payments")
    role = Role.objects.create(name="Reader")
    RolePermission.objects.create(role=role, securable="Infrastructure", operation="Read")
    calls = [("assign_management_group_role", {"group_id": "payments", "username": "bob", "role": "Reader"},
              {"group": group, "user__username": "bob"}),
             ("assign_engine_role", {"principal_id": "bot", "role": "Reader"}, {"user__username": "engine:bot"})]
    for tool, args, held in calls:
        t = ticket_of(sup.call(tool, args))
        assert t.facts["permissions"] == ["Infrastructure:Read"]
        approve(approver, t.id)
        RolePermission.objects.create(role=role, securable="Execution", operation="Execute")
        err = error_of(sup.call(tool, {**args, "approval_id": t.id}))
        assert err["code"] in (-32602, -32003) and "changed after the approval" in err["message"], err
        assert not RoleAssignment.objects.filter(role=role, **held).exists()
        assert Approval.objects.get(pk=t.id).consumed_at is None
        # renamed, and a namesake holding what the approver saw: still not the approved role
        RolePermission.objects.filter(role=role, securable="Execution").delete()
        Role.objects.filter(pk=role.pk).update(name="Reader-old")
        twin = Role.objects.create(name="Reader")
        RolePermission.objects.create(role=twin, securable="Infrastructure", operation="Read")
        err = error_of(sup.call(tool, {**args, "approval_id": t.id}))
        assert "changed after the approval" in err["message"], err
        twin.delete()
        Role.objects.filter(pk=role.pk).update(name="Reader")
        result_of(sup.call(tool, {**args, "approval_id": t.id}))
        assert RoleAssignment.objects.filter(role=role, **held).exists()


def test_an_owner_named_by_username_is_the_account_the_approver_saw(sup, approver, make_user):
    """transfer_engine_principal_owner and create_engine_principal name the (new) owner by username: renamed, and a
    new account given the name, the recall handed the engine principal to a person the approver never saw. The
    tickets pin the account."""
    from django.contrib.auth import get_user_model

    from governance import engines
    from governance.models import EnginePrincipal
    from yuzu.plans import Plan
    from yuzu.rbac import Principal

    owen, nina = make_user("owen"), make_user("nina")
    engines.create_engine_principal(Principal(user=owen), plan=Plan("", {
        "principal_id": "engine:bot", "display_name": "bot", "owner_username": "owen", "justification": "j",
        "classification": "internal"}))
    transfer = {"principal_id": "engine:bot", "new_owner": "nina"}
    create = {"principal_id": "engine:bot2", "display_name": "bot2", "owner_username": "nina", "justification": "j",
              "classification": "internal"}
    tickets = [(tool, args, ticket_of(sup.call(tool, args)).id)
               for tool, args in (("transfer_engine_principal_owner", transfer), ("create_engine_principal", create))]
    for _, _, tid in tickets:
        approve(approver, tid)
    get_user_model().objects.filter(pk=nina.pk).update(username="nina-old")
    impostor = make_user("nina")
    for tool, args, tid in tickets:
        err = error_of(sup.call(tool, {**args, "approval_id": tid}))
        assert err["code"] in (-32602, -32003) and "replaced after the approval" in err["message"], err
        assert Approval.objects.get(pk=tid).consumed_at is None
    assert EnginePrincipal.objects.get(pk="engine:bot").owner_id == owen.pk
    assert not EnginePrincipal.objects.filter(pk="engine:bot2").exists()
    impostor.delete()
    get_user_model().objects.filter(pk=nina.pk).update(username="nina")
    for tool, args, tid in tickets:
        result_of(sup.call(tool, {**args, "approval_id": tid}))
    assert EnginePrincipal.objects.get(pk="engine:bot").owner_id == nina.pk
    assert EnginePrincipal.objects.get(pk="engine:bot2").owner_id == nina.pk


# --- issue 11: nothing invalid reaches a human ----------------------------------------------------

@pytest.mark.parametrize("args, message", [
    ({"plugin": "os", "action": "info", "scope": "ostype == linux AND"}, "invalid scope expression"),
    ({"plugin": "os", "action": "info", "scope": "tag:env == test", "agent_ids": ["a1"]}, "mutually exclusive"),
    ({"plugin": "process", "action": "list", "agent_ids": ["a1"], "params": {"bogus": "1"}},
     "params do not match process.list's parameter schema"),
    ({"plugin": "process", "action": "list", "agent_ids": ["a1"], "params": {"limit": "many"}},
     "params do not match process.list's parameter schema at 'limit'"),
    ({"plugin": "nosuch", "action": "thing", "agent_ids": ["a1"]}, "unknown plugin/action: nosuch.thing"),
    ({"plugin": "os", "action": "info", "agent_ids": ["ghost"]}, NOTHING_TO_APPROVE),
])
def test_invalid_calls_answer_32602_and_mint_no_ticket(sup, args, message):
    agent("a1", tags={"env": "test"})
    err = error_of(sup.call("execute_instruction", args))
    assert err["code"] == -32602 and message in err["message"], err
    assert not Approval.objects.exists()
    row = AuditEvent.objects.filter(action="mcp.execute_instruction").latest("id")
    assert row.result == "failure"


def test_the_same_validation_refuses_the_ungated_call(mcp):
    """One validation function: the operator tier (not gated) gets the same -32602 and nothing is created."""
    agent("a1")
    op = mcp("olga", role="Operator", tier="operator")
    err = error_of(op.call("execute_instruction", {"plugin": "process", "action": "list", "params": {"bogus": "1"}}))
    assert err["code"] == -32602 and "params do not match process.list's parameter schema" in err["message"]
    assert not Execution.objects.exists()
    r = Client().post("/api/v1/executions", {"plugin": "nosuch", "action": "thing"}, content_type="application/json",
                      HTTP_AUTHORIZATION=f"Bearer {op.token}")
    assert r.status_code == 400 and "unknown plugin/action: nosuch.thing" in r.json()["error"]["message"]
    assert not Execution.objects.exists()


def test_a_recall_that_no_longer_validates_keeps_the_ticket(sup, approver):
    a1 = agent("a1")
    args = {"plugin": "file", "action": "hash", "agent_ids": ["a1"], "params": {"path": "/etc/hostname"}}
    ticket = ticket_of(sup.call("execute_instruction", args))
    approve(approver, ticket.id)
    # The agent re-registered with a catalogue that no longer has the action.
    AgentInventory.objects.filter(agent=a1).update(data={"os.info": {"risk": "read", "params": {}}})
    err = error_of(sup.call("execute_instruction", {**args, "approval_id": ticket.id}))
    assert err["code"] == -32602 and "unknown plugin/action: file.hash" in err["message"]
    assert Approval.objects.get(pk=ticket.id).consumed_at is None


# --- the facts on the ticket ----------------------------------------------------------------------

def test_ticket_carries_summary_risk_requester_and_paged_targets(sup, approver, mint):
    for i in range(60):
        agent(f"h{i:02d}", tags={"environment": "prod"})
    ticket = ticket_of(sup.call("execute_instruction", {"plugin": "script", "action": "run",
                                                        "scope": "tag:environment == prod",
                                                        "params": {"argv": "uptime"}}))
    assert ticket.summary == "Run script.run with argv=uptime on 60 agents matching `tag:environment == prod`"
    assert ticket.risk == "write" and "allow-list" in ticket.facts["description"]
    assert ticket.requester["tier"] == "supervised" and ticket.requester["token_name"] == "sam-token"
    assert ticket.requester["client_name"] == "test" and ticket.requester["client_version"] == "0"
    c = Client(HTTP_AUTHORIZATION=f"Bearer {mint('anna', role='Approver')}")
    page2 = c.get(f"/api/v1/approvals/{ticket.id}?page=2").json()["data"]
    assert page2["target_count"] == 60 and page2["summary"] == ticket.summary
    targets = page2["targets"]
    assert (targets["total"], targets["page"], targets["pages"], len(targets["agents"])) == (60, 2, 2, 10)
    assert targets["agents"][0] == {"agent_id": "h50", "hostname": "h50.example", "os": "linux", "groups": [],
                                    "connected": True, "quarantined": False, "enrolled": True}
    assert c.get(f"/api/v1/approvals/{ticket.id}?page=0").status_code == 400


def test_secret_parameters_are_redacted_in_what_the_approver_reads(sup, approver):
    """A probe found the secret in the ticket's arguments (scope_expression), which the REST detail, the list and
    get_approval answered in clear while the review page hid it: the ticket now stores a keyed hash of it, which
    the recall — the same arguments again — still matches, and a different value does not."""
    agent("a1", plugins=False)  # no catalogue reported: parameters are not checked against a schema
    args = {"plugin": "os", "action": "info", "agent_ids": ["a1"], "params": {"api_token": "s3cr3t", "path": "/p"}}
    ticket = ticket_of(sup.call("execute_instruction", args))
    assert "s3cr3t" not in ticket.summary and "s3cr3t" not in str(ticket.facts)
    assert "s3cr3t" not in ticket.scope_expression and '"path":"/p"' in ticket.scope_expression
    shown = result_of(sup.call("get_approval", {"approval_id": ticket.id}))["structuredContent"]
    assert ticket.id in str(shown) and "s3cr3t" not in str(shown)
    approve(approver, ticket.id)
    other = {**args, "params": {"api_token": "another", "path": "/p"}, "approval_id": ticket.id}
    assert error_of(sup.call("execute_instruction", other))["code"] == -32003
    out = result_of(sup.call("execute_instruction", {**args, "approval_id": ticket.id}))["structuredContent"]
    assert out["agents_reached"] == 1 and Approval.objects.get(pk=ticket.id).consumed_at is not None


def test_a_numeric_secret_parameter_is_kept_as_a_keyed_hash_too(sup, approver):
    """A parameter value may be a number (the schema allows it): a PIN or numeric password under a secret name was
    kept in clear in the ticket (the keyed hash took strings only) and answered by get_approval."""
    agent("a1", plugins=False)
    args = {"plugin": "os", "action": "info", "agent_ids": ["a1"], "params": {"pin_key": 918273645, "path": "/p"}}
    ticket = ticket_of(sup.call("execute_instruction", args))
    assert "918273645" not in ticket.scope_expression and '"path":"/p"' in ticket.scope_expression
    shown = result_of(sup.call("get_approval", {"approval_id": ticket.id}))["structuredContent"]
    assert "918273645" not in str(shown)
    approve(approver, ticket.id)
    other = {**args, "params": {"pin_key": 918273646, "path": "/p"}, "approval_id": ticket.id}
    assert error_of(sup.call("execute_instruction", other))["code"] == -32003
    out = result_of(sup.call("execute_instruction", {**args, "approval_id": ticket.id}))["structuredContent"]
    assert out["agents_reached"] == 1


def test_a_bundle_steps_secret_parameters_are_kept_as_keyed_hashes(sup, approver):
    """execute_bundle carries its parameters in steps[*].params: only execute_instruction's top-level params were
    hashed, so a bundle's password stood in clear in the ticket, in get_approval and on the review page."""
    agent("a1", plugins=False)
    steps = [{"plugin": "os", "action": "info", "params": {"password": "hunter2-bundle", "path": "/p"}},
             {"plugin": "os", "action": "info"}]
    args = {"agent_id": "a1", "steps": steps}
    ticket = ticket_of(sup.call("execute_bundle", args))
    assert "hunter2-bundle" not in ticket.scope_expression and '"path":"/p"' in ticket.scope_expression
    assert "hunter2-bundle" not in str(ticket.facts) and "hunter2-bundle" not in ticket.summary
    shown = result_of(sup.call("get_approval", {"approval_id": ticket.id}))["structuredContent"]
    assert "hunter2-bundle" not in str(shown)
    approve(approver, ticket.id)
    changed = [{**steps[0], "params": {"password": "other", "path": "/p"}}, steps[1]]
    assert error_of(sup.call("execute_bundle", {**args, "steps": changed, "approval_id": ticket.id}))["code"] == -32003
    out = result_of(sup.call("execute_bundle", {**args, "approval_id": ticket.id}))["structuredContent"]
    assert out["expected"] == 2


def test_a_submitter_without_approval_read_follows_its_own_ticket(mcp, mint):
    """A probe: an ITServiceOwner's supervised token was told to poll get_approval (or GET status_url) and both
    answered permission denied: Approval:Read — a role it never needed to mint the ticket. Its own tickets are
    readable with no role; anyone else's still read as not found."""
    agent("a1")
    owner = mcp("ivy", role="ITServiceOwner", tier="supervised")
    err = error_of(owner.call("execute_instruction", {"plugin": "os", "action": "info", "agent_ids": ["a1"]}))
    assert err["code"] == -32006
    tid = err["data"]["approval_id"]
    shown = result_of(owner.call("get_approval", {"approval_id": tid}))["structuredContent"]
    assert (shown["id"], shown["status"]) == (tid, "pending")
    listed = result_of(owner.call("list_pending_approvals", {}))["structuredContent"]
    assert [a["id"] for a in listed["approvals"]] == [tid]
    r = Client(HTTP_AUTHORIZATION=f"Bearer {owner.token}").get(err["data"]["status_url"])
    assert r.status_code == 200 and r.json()["data"]["status"] == "pending"
    raw = mint("ivy2", role="ITServiceOwner", tier="readonly")
    r = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get(err["data"]["status_url"])
    assert r.status_code == 404  # another's ticket: absent, as before
    other = mcp("olga", role="ITServiceOwner", tier="supervised")
    assert error_of(other.call("get_approval", {"approval_id": tid}))["code"] == -32602


# --- withdrawing and expiry -----------------------------------------------------------------------

def test_the_submitter_withdraws_its_own_pending_ticket(sup, approver, mcp, mint):
    agent("a1")
    args = {"plugin": "os", "action": "info", "agent_ids": ["a1"]}
    ticket = ticket_of(sup.call("execute_instruction", args))
    other = mcp("olga", role="Administrator", tier="supervised")
    err = error_of(other.call("withdraw_approval", {"approval_id": ticket.id}))
    assert err["code"] == -32602 and err["message"].startswith("approval not found")
    out = result_of(sup.call("withdraw_approval", {"approval_id": ticket.id}))["structuredContent"]
    assert out == {"id": ticket.id, "status": "withdrawn"}
    assert AuditEvent.objects.filter(action="approval.withdraw", target_id=ticket.id, principal="sam").exists()
    err = error_of(sup.call("execute_instruction", {**args, "approval_id": ticket.id}))
    assert err["code"] == -32003 and err["message"] == "approval was withdrawn"
    with pytest.raises(Exception, match="only pending approvals can be reviewed"):
        approve(approver, ticket.id)
    assert error_of(sup.call("withdraw_approval", {"approval_id": ticket.id}))["code"] == -32602
    # The operator tier (which mints Tag:Delete tickets) may withdraw too, over MCP or REST.
    op = mcp("olive", role="Operator", tier="operator")
    Tag.objects.create(agent_id="a1", key="owner", value="x")
    t2 = ticket_of(op.call("delete_tag", {"agent_id": "a1", "key": "owner"}))
    r = Client().post(f"/api/v1/approvals/{t2.id}/withdraw", HTTP_AUTHORIZATION=f"Bearer {op.token}")
    assert r.status_code == 200 and Approval.objects.get(pk=t2.id).status == "withdrawn"


def test_expired_pending_tickets_leave_the_queue_on_their_own(sup, mint):
    agent("a1")
    ticket = ticket_of(sup.call("execute_instruction", {"plugin": "os", "action": "info", "agent_ids": ["a1"]}))
    Approval.objects.filter(pk=ticket.id).update(submitted_at=ticket.submitted_at - APPROVAL_LIFETIME
                                                  - timedelta(seconds=1))
    c = Client(HTTP_AUTHORIZATION=f"Bearer {mint('anna', role='Approver')}")
    assert c.get("/api/v1/approvals").json()["data"] == []
    assert c.get("/api/v1/approvals/pending/count").json()["data"] == {"pending": 0}
    assert Approval.objects.get(pk=ticket.id).status == "pending"  # not swept yet, and still not listed
    # … and each view of it says expired, not pending with a review to offer (a probe saw "pending" there)
    shown = c.get(f"/api/v1/approvals/{ticket.id}").json()["data"]
    assert (shown["status"], shown["may_review"]) == ("expired", False)
    assert result_of(sup.call("get_approval", {"approval_id": ticket.id}))["structuredContent"]["status"] == "expired"
    err = error_of(sup.call("withdraw_approval", {"approval_id": ticket.id}))
    assert err["message"] == "only a pending, or approved and unused, ticket can be withdrawn (this one is expired)"


def test_an_approved_schedule_still_fires_after_the_tickets_seven_days(mcp, mint, approver):
    """A supervised schedule's ticket is a standing approval (never consumed: each run is approved by it). The lazy
    7-day expiry of approved, unconsumed tickets turned it expired, so a schedule whose first run came more than a
    week after it was asked for (weekly, monthly, once at a later date) was refused and disabled when it came due."""
    from fleet.models import InstructionDefinition
    from operations import schedules
    from operations.models import InstructionSchedule
    from yuzu.models import ApiToken
    from yuzu.rbac import Principal

    agent("a1")
    InstructionDefinition.objects.create(id="up", name="uptime", plugin="system", action="uptime")
    mint("sup", role="Administrator", tier="supervised")
    token = ApiToken.objects.get(owner__username="sup")
    row = schedules.create_schedule(Principal(user=token.owner, token=token), {
        "name": "weekly", "definition_id": "up", "frequency_type": "weekly", "time_of_day": "03:00",
        "day_of_week": 0})
    approve(approver, row["approval_id"])
    Approval.objects.filter(pk=row["approval_id"]).update(submitted_at=timezone.now() - timedelta(days=8))
    Approval.objects.expire_stale()  # any mint or review anywhere sweeps
    assert Approval.objects.get(pk=row["approval_id"]).current_status == Approval.APPROVED
    InstructionSchedule.objects.filter(pk=row["id"]).update(next_execution_at=timezone.now())
    schedules.tick()
    assert Execution.objects.count() == 1
    assert InstructionSchedule.objects.get(pk=row["id"]).enabled


def test_a_credential_revocation_waits_for_the_approver_and_acts_on_the_pinned_agent_only(sup, approver):
    """revoke_agent_credential on the supervised tier: a ticket pinned to the agent, nothing revoked until the
    approved recall; the approval does not stretch to another agent."""
    agent("a1", credential_hash="1" * 64)
    agent("a2", credential_hash="2" * 64)
    ca.authority()
    certs = {a: IssuedCert.objects.create(serial_hex=f"0A{n}", subject=f"CN={a}", purpose="agent", agent_id=a,
                                          not_after=timezone.now() + timedelta(days=30), issued_by="test",
                                          cert_pem="-", issuer_fingerprint="-", issuer_key_id="-")
             for n, a in enumerate(("a1", "a2"))}
    t = ticket_of(sup.call("revoke_agent_credential", {"agent_id": "a1", "reason": "stolen laptop"}))
    assert t.pins == {"agents": ["a1"]} and t.risk == "destructive" and "stolen laptop" in t.summary
    # the approver is told the agent's certificates go with it, and which
    assert "every certificate it holds is revoked with it" in t.summary and "0A0" in t.summary, t.summary
    assert "0A1" not in t.summary
    assert Agent.objects.get(pk="a1").credential_hash == "1" * 64
    assert IssuedCert.objects.get(pk="0A0").status == "active"
    approve(approver, t.id)
    err = error_of(sup.call("revoke_agent_credential", {"agent_id": "a2", "approval_id": t.id}))
    assert err["code"] != -32006 and Agent.objects.get(pk="a2").credential_hash == "2" * 64, err
    out = result_of(sup.call("revoke_agent_credential", {"agent_id": "a1", "reason": "stolen laptop",
                                                         "approval_id": t.id}))
    assert out["structuredContent"] == {"agent_id": "a1", "revoked": True, "certificates_revoked": ["0A0"],
                                        "crl_republished": True}
    assert Agent.objects.get(pk="a1").credential_hash == ""
    assert IssuedCert.objects.get(pk=certs["a1"].pk).status == "revoked"
    assert IssuedCert.objects.get(pk=certs["a2"].pk).status == "active"
    assert AuditEvent.objects.filter(action="ca.cert.revoked", target_id="0A0", principal="sam").exists()
    assert AuditEvent.objects.filter(action="agent.credential.revoked", target_id="a1", principal="sam").exists()
