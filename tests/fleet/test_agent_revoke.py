"""Cutting an agent off, against the real consumer (Channels' WebsocketCommunicator): revoking its credential
(fleet.services.revoke_agent_credential) or deleting its Agent row closes its live socket at once through the
channel layer, at the next heartbeat if that message is lost, and refuses its credential on reconnect; the device
must enrol again with a new device token. And a device token minted without --max-uses enrols one agent."""

import asyncio
import io
import time

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from fleet import services
from fleet.models import Agent, DeviceToken
from tests.support.agent_ws import closed_with, connect, enrolled_agent, mint_device_token, register_msg
from tests.support.otp import code
from yuzu.auth import MFA_SESSION_KEY
from yuzu.errors import YuzuError
from yuzu.models import AuditEvent, TOTPDevice

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager_celery")]
db = database_sync_to_async


def test_revoking_the_credential_closes_the_live_socket_and_refuses_reconnect(principal):
    token = mint_device_token("--max-uses", "2")
    admin = principal("root", "Administrator")

    async def scenario():
        comm, agent_id, credential, _ = await enrolled_agent(token)
        out = await db(services.revoke_agent_credential)(admin, agent_id, "laptop stolen")
        assert out == {"agent_id": agent_id, "revoked": True, "certificates_revoked": [], "crl_republished": False}
        assert "revoked" in await closed_with(comm, 4401)  # at once, through the channel layer
        comm = await connect()
        await comm.send_json_to(register_msg(agent_id, credential))
        assert "invalid agent credential" in await closed_with(comm, 4401)
        # re-enrolment with a device token is the way back: a new identity
        comm, new_id, _, _ = await enrolled_agent(token)
        assert new_id != agent_id
        await comm.disconnect()
        return agent_id

    agent_id = asyncio.run(scenario())
    assert AuditEvent.objects.filter(action="agent.credential.revoked", target_id=agent_id, result="success",
                                     detail__contains="laptop stolen").exists()
    assert not Agent.objects.get(pk=agent_id).connected
    with pytest.raises(YuzuError, match="already revoked"):  # nothing to do twice
        services.revoke_agent_credential(admin, agent_id)


def test_heartbeat_closes_a_connection_whose_credential_was_revoked_meanwhile():
    """If the push is lost (another process, a layer hiccup), the next heartbeat checks the store."""
    token = mint_device_token()

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        await db(Agent.objects.filter(pk=agent_id).update)(credential_hash="")  # no push
        await comm.send_json_to({"type": "heartbeat"})
        assert "revoked" in await closed_with(comm, 4401)

    asyncio.run(scenario())


def test_deleting_the_agent_closes_its_live_socket_at_once():
    token = mint_device_token()

    async def scenario():
        comm, agent_id, credential, _ = await enrolled_agent(token)
        await db(lambda: Agent.objects.get(pk=agent_id).delete())()
        assert "deleted" in await closed_with(comm, 4401)
        comm = await connect()
        await comm.send_json_to(register_msg(agent_id, credential))
        await closed_with(comm, 4401)

    asyncio.run(scenario())


def test_heartbeat_closes_a_connection_whose_agent_was_deleted_meanwhile(monkeypatch):
    token = mint_device_token()
    monkeypatch.setattr("fleet.apps.send_to_agent", lambda *a, **k: None)  # the push lost

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)
        await db(lambda: Agent.objects.get(pk=agent_id).delete())()
        await comm.send_json_to({"type": "heartbeat"})
        await closed_with(comm, 4401)

    asyncio.run(scenario())


@pytest.mark.parametrize("role, group", [("Viewer", None), ("Operator", None), ("Administrator", "other")])
def test_who_may_not_revoke_a_credential(principal, role, group):
    """A fleet-wide Security:Delete, as a certificate's revocation: a grant on one group does not reach it (the
    token tiers are the MCP pipeline's and rbac.check's: tests/yuzu/test_authorization_matrix.py)."""
    from fleet.models import ManagementGroup

    g = ManagementGroup.objects.create(name="other") if group else None
    agent = Agent.objects.create(agent_id="ab12", credential_hash="x" * 64)
    if g:
        g.members.add(agent)
    p = principal("mallory", role, group=g)
    with pytest.raises(YuzuError) as exc:
        services.plan_revoke_agent_credential(p, "ab12")
    assert exc.value.status in (403, 404)
    assert Agent.objects.get(pk="ab12").credential_hash == "x" * 64


def test_a_token_minted_without_max_uses_enrols_one_agent():
    out = io.StringIO()
    call_command("mint_device_token", "--name", "one", stdout=out)
    token = out.getvalue().strip()
    assert DeviceToken.objects.get().max_uses == 1

    async def scenario():
        comm, _, _, _ = await enrolled_agent(token)
        await comm.disconnect()
        comm = await connect()
        await comm.send_json_to({"type": "enroll", "token": token, "hostname": "web-2"})
        await closed_with(comm, 4401)

    asyncio.run(scenario())


def test_unlimited_uses_must_be_asked_for():
    call_command("mint_device_token", "--name", "fleet", "--unlimited-uses", stdout=io.StringIO())
    assert DeviceToken.objects.get().max_uses is None
    with pytest.raises(CommandError):
        call_command("mint_device_token", "--name", "x", "--unlimited-uses", "--max-uses", "3")



# --- the admin's action ----------------------------------------------------------------------------

AGENTS = "/admin/fleet/agent/"


def admin_session(make_user, role, superuser=True):
    user = make_user(f"boss-{role.lower()}", role, superuser=superuser, password="s3cret-password")
    if not superuser:  # staff, Django's permissions on the Agents page: what the page shows is Django's
        user.is_staff = True
        user.save()
        user.user_permissions.add(*Permission.objects.filter(codename__in=("view_agent", "change_agent")))
    device = TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    c = Client()
    r = c.post("/admin/login/?next=/admin/", {"username": user.username, "password": "s3cret-password",
                                               "otp_token": code(device)})
    assert r.status_code == 302
    return c


def test_the_admin_revokes_a_credential_with_a_fresh_code_only(make_user):
    Agent.objects.create(agent_id="ab12", hostname="web-1", credential_hash="x" * 64)
    c = admin_session(make_user, "Administrator")
    s = c.session
    s[MFA_SESSION_KEY] = time.time() - 3600  # the login's proof has gone stale
    s.save()
    r = c.post(AGENTS, {"action": "revoke_credential", "_selected_action": ["ab12"]}, follow=True)
    assert "fresh authenticator code" in r.content.decode()
    assert Agent.objects.get(pk="ab12").credential_hash
    s = c.session
    s[MFA_SESSION_KEY] = time.time()
    s.save()
    r = c.post(AGENTS, {"action": "revoke_credential", "_selected_action": ["ab12"]}, follow=True)
    assert "credential revoked" in r.content.decode()
    assert Agent.objects.get(pk="ab12").credential_hash == ""
    assert AuditEvent.objects.filter(action="agent.credential.revoked", target_id="ab12", result="success",
                                     principal="boss-administrator").exists()


def test_the_admin_offers_the_revoke_only_to_a_fleet_wide_security_delete(make_user):
    """A staff user Django lets change agents, whose role lacks Security:Delete: the page is Django's, the revoke
    is RBAC's."""
    Agent.objects.create(agent_id="ab12", hostname="web-1", credential_hash="x" * 64)
    c = admin_session(make_user, "Viewer", superuser=False)
    page = c.get(AGENTS)
    assert page.status_code == 200 and "revoke_credential" not in page.content.decode()
    c.post(AGENTS, {"action": "revoke_credential", "_selected_action": ["ab12"]})
    assert Agent.objects.get(pk="ab12").credential_hash == "x" * 64
