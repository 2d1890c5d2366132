"""Engine principals end to end through the official MCP Python client against a real daphne (issue 20, Must
show): create an engine principal, mint its credential, use it on /mcp/v1/ within its roles and be refused
outside them; rotate and confirm through the approval flow, a failing pre-consume precondition leaving the
ticket reusable."""

import json
import subprocess
import time

import pytest

from approvals.models import Approval
from approvals.services import review
from fleet.models import Agent
from governance.models import EnginePrincipal, EngineRotation
from tests.support.official_client import DRIVE, MCP_PY, client_env
from yuzu.models import ApiToken, Role, RolePermission, TOTPDevice
from yuzu.rbac import Principal, seed_builtin_roles

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]
PID = "engine:patch-bot"


def drive(server, token, steps, cwd, background=False):
    cmd = [str(MCP_PY), str(DRIVE), "--url", server.mcp, "--token", token, "--mode", "legacy",
           "--steps", json.dumps(steps)]
    proc = subprocess.Popen(cmd, cwd=cwd, env=client_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if background:
        return proc
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out)


def wait_ticket(definition, proc, n=1, timeout=60):
    deadline = time.monotonic() + timeout
    while Approval.objects.filter(definition_id=f"mcp.{definition}").count() < n:
        assert time.monotonic() < deadline and proc.poll() is None, f"no {definition} ticket was minted"
        time.sleep(0.1)
    return Approval.objects.filter(definition_id=f"mcp.{definition}").order_by("-submitted_at").first()


def wait_file(path, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline and proc.poll() is None, f"the client never reached {path.name}"
        time.sleep(0.1)


def test_engine_principal_lifecycle_through_the_official_client(daphne, mint, make_user, tmp_path):
    if not MCP_PY.exists():
        pytest.fail(f"{MCP_PY} is missing: run `make test`")
    seed_builtin_roles()
    make_user("owen")
    reader = Role.objects.create(name="FleetReader", description="reads agents")
    RolePermission.objects.create(role=reader, securable="Infrastructure", operation="Read")
    Agent.objects.create(agent_id="gov-01", hostname="gov-01", connected=True)
    root = mint("root", role="Administrator")
    sue = mint("sue", role="Administrator", tier="supervised")
    ann = make_user("ann", "Administrator")
    TOTPDevice.objects.create(user=ann, name="phone", confirmed=True)
    approver = Principal(user=ann, via="session", mfa_verified_at=time.time())
    server = daphne()

    # 1. An administrator (untiered token: no approval) registers the principal, grants a narrow role, mints.
    setup = drive(server, root, [
        {"op": "call", "tool": "create_engine_principal", "as": "create", "args": {
            "principal_id": PID, "display_name": "Patch bot", "owner_username": "owen",
            "justification": "applies patches nightly", "classification": "internal"}},
        {"op": "call", "tool": "assign_engine_role", "as": "assign", "args": {"principal_id": "patch-bot",
                                                                              "role": "FleetReader"}},
        {"op": "call", "tool": "assign_engine_role", "as": "assign_admin", "args": {"principal_id": "patch-bot",
                                                                                    "role": "Administrator"}},
        {"op": "call", "tool": "mint_engine_credential", "as": "mint", "args": {"principal_id": PID, "ttl_days": 7}},
        {"op": "call", "tool": "audit_engine_no_admin", "as": "proof", "args": {}},
    ], tmp_path)
    assert setup["calls"]["create"]["structured"]["lifecycle_state"] == "active"
    assert setup["calls"]["assign_admin"]["error"]["code"] == -32602
    assert setup["calls"]["proof"]["structured"] == {"ok": True, "violations": []}
    minted = setup["calls"]["mint"]["structured"]
    assert all(setup["calls"][k].get("schema_ok", True) for k in ("create", "mint", "proof"))

    # 2. The engine's own credential: within its role it reads; outside it is refused (RBAC, tier, the belt).
    engine = drive(server, minted["raw_token"], [
        {"op": "call", "tool": "list_agents", "as": "inside", "args": {}},
        {"op": "call", "tool": "query_audit_log", "as": "not_its_role", "args": {}},
        {"op": "call", "tool": "set_tag", "as": "above_its_tier", "args": {"agent_id": "gov-01", "key": "k",
                                                                           "value": "v"}},
        {"op": "call", "tool": "list_engine_principals", "as": "belt", "args": {}},
    ], tmp_path)
    calls = engine["calls"]
    assert [a["agent_id"] for a in calls["inside"]["structured"]["agents"]] == ["gov-01"]
    assert calls["not_its_role"]["error"]["code"] == -32003
    assert calls["above_its_tier"]["error"]["code"] == -32004
    assert calls["belt"]["error"]["code"] == -32003

    # 3. A supervised operator rotates and confirms, each through a human approval.
    flags = {n: tmp_path / n for n in ("rotate_ok", "confirm_ok", "failed_once", "restored")}
    recall_rotate = {"principal_id": PID, "approval_id": "@calls.rotate.error.data.approval_id"}
    confirm_args = {"principal_id": PID, "token_id": "@calls.rotate_recall.structured.token_id",
                    "secret": "@calls.rotate_recall.structured.raw_token"}
    proc = drive(server, sue, [
        {"op": "call", "tool": "rotate_engine_credential", "as": "rotate", "args": {"principal_id": PID}},
        {"op": "wait_for_file", "path": str(flags["rotate_ok"]), "timeout": 60},
        {"op": "call", "tool": "rotate_engine_credential", "as": "rotate_recall", "args": recall_rotate},
        {"op": "call", "tool": "confirm_engine_rotation", "as": "confirm", "args": confirm_args},
        {"op": "wait_for_file", "path": str(flags["confirm_ok"]), "timeout": 60},
        {"op": "call", "tool": "confirm_engine_rotation", "as": "confirm_blocked",
         "args": {**confirm_args, "approval_id": "@calls.confirm.error.data.approval_id"}},
        {"op": "touch", "path": str(flags["failed_once"])},
        {"op": "wait_for_file", "path": str(flags["restored"]), "timeout": 60},
        {"op": "call", "tool": "confirm_engine_rotation", "as": "confirm_recall",
         "args": {**confirm_args, "approval_id": "@calls.confirm.error.data.approval_id"}},
        {"op": "call", "tool": "confirm_engine_rotation", "as": "confirm_replay",
         "args": {**confirm_args, "approval_id": "@calls.confirm.error.data.approval_id"}},
        {"op": "call", "tool": "get_engine_principal", "as": "after", "args": {"principal_id": PID}},
    ], tmp_path, background=True)
    try:
        ticket = wait_ticket("rotate_engine_credential", proc)
        assert EnginePrincipal.objects.get().active_credentials().count() == 1  # nothing before approval
        review(approver, ticket.id, "approved")
        flags["rotate_ok"].touch()
        ticket = wait_ticket("confirm_engine_rotation", proc)
        rotation = EngineRotation.objects.get()
        assert "yuzu_" not in ticket.scope_expression  # the proof of possession is stored hashed
        review(approver, ticket.id, "approved")
        # Between approval and recall the rotation stops being confirmable (its predecessor is revoked behind
        # the server's back): the recall must be refused with the ticket left unconsumed.
        predecessor = ApiToken.objects.filter(pk=rotation.predecessor_id)
        predecessor.update(revoked_at="2026-01-01T00:00:00Z")
        flags["confirm_ok"].touch()
        wait_file(flags["failed_once"], proc)
        assert Approval.objects.get(pk=ticket.id).consumed_at is None
        predecessor.update(revoked_at=None)
        flags["restored"].touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    calls = json.loads(out)["calls"]
    assert calls["rotate"]["error"]["code"] == -32006
    successor = calls["rotate_recall"]["structured"]
    assert successor["principal_id"] == PID and successor["token_id"] != minted["token_id"]
    assert calls["confirm"]["error"]["code"] == -32006
    blocked = calls["confirm_blocked"]["error"]
    assert blocked["code"] == -32003 and "cannot be redeemed right now" in blocked["message"]
    assert calls["confirm_recall"]["structured"] == {"confirmed": True, "principal_id": PID}
    assert calls["confirm_replay"]["error"]["message"] == "approval already used (one-time ticket)"
    assert calls["after"]["structured"]["active_credentials"] == 1
    assert Approval.objects.get(pk=ticket.id).consumed_at is not None

    # 4. The old credential is dead, the new one works.
    old = drive(server, successor["raw_token"], [{"op": "call", "tool": "list_agents", "as": "new", "args": {}}],
                tmp_path)
    assert old["calls"]["new"]["structured"]["agents"]
    assert not ApiToken.objects.get(pk=minted["token_id"]).is_live()
