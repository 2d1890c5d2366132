"""Agent certificates over the agent WebSocket, against the real consumer (Channels' WebsocketCommunicator):
cert.enroll after the token enrolment, the challenge and proof on every later connection, a revoked
certificate closing the live connection at once (and at the next heartbeat if the push is lost) and refused
on reconnect, and what a peer without the key gets."""

import base64
import time
from datetime import timedelta
from functools import partial

import pytest
from channels.db import database_sync_to_async
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.utils import timezone

from fleet import identity
from fleet import services as fleet_services
from fleet.agent.client import proof, renewal_due
from fleet.models import Agent
from pki import ca, services
from pki.models import CrlVersion, IssuedCert
from tests.pki.test_ca import csr_for, keypair, unknown_algorithm_csrs
from tests.support.agent_ws import closed_with, connect, enrolled_agent, mint_device_token, register_msg, send
from tests.support.races import at_once
from yuzu.models import AuditEvent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager_celery")]
db = database_sync_to_async


def new_key():
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    csr = (x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
           .public_bytes(serialization.Encoding.PEM).decode())
    return pem, csr


async def enrolled_with_cert(token):
    """Enrol, register, cert.enroll: (comm, agent_id, credential, key_pem, cert_pem, serial)."""
    comm, agent_id, credential, _ = await enrolled_agent(token)
    key_pem, csr = new_key()
    issued = await send(comm, {"type": "cert.enroll", "csr_pem": csr})
    assert issued["type"] == "cert.issued", issued
    assert issued["chain_pem"] == (await db(ca.authority)()).cert_pem
    return comm, agent_id, credential, key_pem, issued["cert_pem"], issued["serial_hex"]


async def proved(agent_id, credential, key_pem, cert_pem, sign_with=None, refused=False):
    """Connect, take the challenge, register with the certificate and a proof; the registered reply, or
    (``refused``) nothing: the caller reads the close."""
    comm = await connect()
    challenge = await send(comm, {"type": "challenge"})
    assert challenge["type"] == "challenge" and len(challenge["nonce"]) == 64
    msg = register_msg(agent_id, credential, cert_pem=cert_pem,
                       proof=proof(sign_with or key_pem, challenge["nonce"], agent_id))
    if refused:
        await comm.send_json_to(msg)
        return comm, None
    return comm, await send(comm, msg)


async def proved_then_revoked_quietly(token, reason):
    """An agent with a certificate, connected again with its proof; its certificate then revoked without the push
    that would close the connection (lost, or not yet delivered). → (the open connection, agent id)."""
    comm, agent_id, credential, key_pem, cert_pem, serial = await enrolled_with_cert(token)
    await comm.disconnect()
    comm, _ = await proved(agent_id, credential, key_pem, cert_pem)
    row = await db(IssuedCert.objects.get)(pk=serial)
    await db(row.revoke)(reason)
    return comm, agent_id


def test_enrol_certificate_then_prove_it_on_reconnect():
    token = mint_device_token()

    async def scenario():
        comm, agent_id, credential, key_pem, cert_pem, serial = await enrolled_with_cert(token)
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        assert cert.subject.rfc4514_string() == f"CN={agent_id}"
        # a second CSR while the certificate is young: refused, connection stays up
        refused = await send(comm, {"type": "cert.enroll", "csr_pem": new_key()[1]})
        assert refused["type"] == "cert.refused"
        await comm.disconnect()
        comm, reply = await proved(agent_id, credential, key_pem, cert_pem)
        assert reply["type"] == "registered"
        await comm.disconnect()
        # the credential alone no longer admits this agent
        comm = await connect()
        await comm.send_json_to(register_msg(agent_id, credential))
        assert "prove it" in await closed_with(comm, 4401)
        # nor does the certificate without its key
        comm, _ = await proved(agent_id, credential, key_pem, cert_pem, sign_with=new_key()[0], refused=True)
        assert "proof" in await closed_with(comm, 4401)
        return serial

    serial = __import__("asyncio").run(scenario())
    assert IssuedCert.objects.get(pk=serial).purpose == "agent"


def test_revocation_closes_the_live_connection_and_refuses_reconnect(principal):
    token = mint_device_token()
    admin = principal("root", "Administrator")

    async def scenario():
        comm, agent_id, credential, key_pem, cert_pem, serial = await enrolled_with_cert(token)
        await comm.disconnect()
        comm, reply = await proved(agent_id, credential, key_pem, cert_pem)
        assert reply["type"] == "registered"
        await db(services.revoke_certificate)(admin, serial, "stolen")
        assert "revoked" in await closed_with(comm, 4401)  # at once, through the channel layer
        comm, _ = await proved(agent_id, credential, key_pem, cert_pem, refused=True)
        assert "revoked" in await closed_with(comm, 4401)
        # no new certificate on the credential while the revocation stands
        comm = await connect()
        await comm.send_json_to(register_msg(agent_id, credential))
        await closed_with(comm, 4401)

    __import__("asyncio").run(scenario())
    assert AuditEvent.objects.filter(action="agent.register", result="failure").exists()


def test_heartbeat_closes_a_connection_whose_certificate_was_revoked_meanwhile():
    """If the revocation push is lost (another process, a layer hiccup), the next heartbeat checks the store."""
    token = mint_device_token()

    async def scenario():
        comm, _ = await proved_then_revoked_quietly(token, "quiet")
        await comm.send_json_to({"type": "heartbeat"})
        assert "revoked" in await closed_with(comm, 4401)

    __import__("asyncio").run(scenario())


@pytest.mark.parametrize("frame, why", [
    ({"cert_pem": "x"}, "go together"),
    ({"proof": "AAAA"}, "go together"),
    ({"cert_pem": "-----BEGIN\x00", "proof": "AAAA"}, "cert_pem"),
    ({"cert_pem": "x" * 9000, "proof": "AAAA"}, "cert_pem"),
    ({"cert_pem": "x", "proof": "not base64!"}, "proof"),
])
def test_malformed_proofs_close_4400(frame, why):
    token = mint_device_token()

    async def scenario():
        comm, agent_id, credential, _ = await enrolled_agent(token)
        await comm.disconnect()
        comm = await connect()
        if "go together" not in why:
            await send(comm, {"type": "challenge"})
        await comm.send_json_to(register_msg(agent_id, credential, **frame))
        assert why in await closed_with(comm, 4400)

    __import__("asyncio").run(scenario())


def test_cert_enroll_refuses_bad_csrs_without_closing():
    token = mint_device_token()

    async def scenario():
        comm, *_ = await enrolled_agent(token)
        for bad in ("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
                    base64.b64encode(b"junk").decode(), *unknown_algorithm_csrs()):
            reply = await send(comm, {"type": "cert.enroll", "csr_pem": bad})
            assert reply["type"] == "cert.refused" and "CSR" in reply["error"] or "PEM" in reply["error"]
        await comm.send_json_to({"type": "cert.enroll", "csr_pem": "\x00"})
        await closed_with(comm, 4400)

    __import__("asyncio").run(scenario())


def test_challenge_only_before_register_and_once():
    token = mint_device_token()

    async def scenario():
        comm = await connect()
        await send(comm, {"type": "challenge"})
        await comm.send_json_to({"type": "challenge"})
        assert "one challenge" in await closed_with(comm, 4400)
        comm, *_ = await enrolled_agent(token)
        await comm.send_json_to({"type": "challenge"})
        assert "after register" in await closed_with(comm, 4400)

    __import__("asyncio").run(scenario())


def test_renewal_in_the_last_third_of_the_certificate_life():
    token = mint_device_token()

    async def scenario():
        comm, agent_id, credential, key_pem, cert_pem, serial = await enrolled_with_cert(token)
        await comm.disconnect()
        comm, _ = await proved(agent_id, credential, key_pem, cert_pem)
        assert (await send(comm, {"type": "cert.enroll", "csr_pem": new_key()[1]}))["type"] == "cert.refused"
        await db(IssuedCert.objects.filter(pk=serial).update)(issued_at=timezone.now() - timedelta(days=250),
                                                              not_after=timezone.now() + timedelta(days=115))
        renewed = await send(comm, {"type": "cert.enroll", "csr_pem": new_key()[1]})
        assert renewed["type"] == "cert.issued" and renewed["serial_hex"] != serial
        await comm.disconnect()
        return serial, renewed["cert_pem"]

    old, new_pem = __import__("asyncio").run(scenario())
    assert IssuedCert.objects.get(pk=old).status == "active"  # the old one runs out on its own
    assert not renewal_due(new_pem) and renewal_due(new_pem, now=time.time() + 250 * 86400)


def test_one_agent_enrolling_on_two_connections_at_once_gets_one_certificate():
    """Each enrolment found no active certificate before the other had written its own: the agent held two (or
    three) live certificates, where one is the rule and a revocation of the one shown leaves the other working."""
    ca.authority()
    for n in range(5):  # the extra certificates showed in the first round on PostgreSQL
        agent_id = f"{n:032x}"
        Agent.objects.create(agent_id=agent_id, hostname=agent_id, credential_hash="x" * 64)
        csrs = [csr_for(keypair()) for _ in range(3)]
        outcomes = at_once(*[partial(identity.enroll_certificate, agent_id, csr, None) for csr in csrs])
        assert sorted(kind for kind, _ in outcomes) == ["error", "error", "ok"], outcomes
        assert all(str(exc) == "this agent already holds a certificate" for kind, exc in outcomes if kind == "error")
        assert IssuedCert.objects.filter(agent_id=agent_id).count() == 1


def test_a_connection_whose_certificate_was_revoked_cannot_obtain_a_new_one():
    """The revocation reaches the live connection through the channel layer, or at its next heartbeat if that push
    is lost: until then the connection is still open, and its cert.enroll was served as an agent without any
    certificate — a fresh one, outliving the revocation that was meant to cut the key's holder off."""
    token = mint_device_token()

    async def scenario():
        comm, agent_id = await proved_then_revoked_quietly(token, "stolen")
        refused = await send(comm, {"type": "cert.enroll", "csr_pem": new_key()[1]})
        assert refused["type"] == "cert.refused" and "revoked" in refused["error"], refused
        await comm.disconnect()
        return agent_id

    agent_id = __import__("asyncio").run(scenario())
    assert not IssuedCert.objects.filter(agent_id=agent_id).active().exists()
    assert AuditEvent.objects.filter(action="ca.cert.reissue_blocked", target_id=agent_id).exists()


async def renewed_agent(token):
    """An agent whose certificate is due for renewal, renewed on a connection that proved it: (comm, agent_id,
    credential, key_pem, cert_pem, the old serial, the cert.issued frame of the new one) — both still active."""
    comm, agent_id, credential, key_pem, cert_pem, serial = await enrolled_with_cert(token)
    await comm.disconnect()
    await db(IssuedCert.objects.filter(pk=serial).update)(issued_at=timezone.now() - timedelta(days=250),
                                                          not_after=timezone.now() + timedelta(days=115))
    comm, _ = await proved(agent_id, credential, key_pem, cert_pem)
    renewed = await send(comm, {"type": "cert.enroll", "csr_pem": new_key()[1]})
    assert renewed["type"] == "cert.issued"
    return comm, agent_id, credential, key_pem, cert_pem, serial, renewed


def test_revoking_a_renewed_certificate_revokes_the_one_it_replaced(principal):
    """After a renewal the agent holds two active certificates until the old one runs out (a third of a year): the
    one list_issued_certs shows first is the new one, and revoking it left the old key admitted."""
    token = mint_device_token()
    admin = principal("root", "Administrator")

    async def scenario():
        comm, agent_id, credential, key_pem, cert_pem, serial, renewed = await renewed_agent(token)
        out = await db(services.revoke_certificate)(admin, renewed["serial_hex"], "key compromise")
        assert out["revoked"] and serial in out["also_revoked"]
        assert "revoked" in await closed_with(comm, 4401)
        comm, _ = await proved(agent_id, credential, key_pem, cert_pem, refused=True)  # the old key
        assert "revoked" in await closed_with(comm, 4401)
        return serial

    old = __import__("asyncio").run(scenario())
    assert IssuedCert.objects.get(pk=old).status == "revoked"
    assert AuditEvent.objects.filter(action="ca.cert.revoked", target_id=old, result="success").exists()


def test_revoking_an_agents_credential_revokes_its_active_certificates(principal):
    """fleet.services.revoke_agent_credential (behind the MCP tool, the REST route and the admin action) revokes
    every certificate of the agent still active — its current one and one a renewal replaced — through the CA's
    revocation: audited, in the next CRL. Another agent's certificate stays. The device that enrols again with a
    new device token gets a certificate as any new agent does."""
    token = mint_device_token()
    admin = principal("root", "Administrator")

    async def scenario():
        comm, agent_id, credential, key_pem, cert_pem, serial, renewed = await renewed_agent(token)
        other_comm, _, _, _, _, other = await enrolled_with_cert(token)
        await other_comm.disconnect()
        out = await db(fleet_services.revoke_agent_credential)(admin, agent_id, "laptop stolen")
        assert out["revoked"] and sorted(out["certificates_revoked"]) == sorted([serial, renewed["serial_hex"]])
        assert out["crl_republished"] is True
        assert "revoked" in await closed_with(comm, 4401)
        # the same device, enrolled again with a device token: a new agent, certified as usual
        comm, new_id, _, _, _, fresh = await enrolled_with_cert(token)
        await comm.disconnect()
        assert new_id != agent_id
        return agent_id, [serial, renewed["serial_hex"]], other, fresh

    agent_id, revoked, other, fresh = __import__("asyncio").run(scenario())
    for s in revoked:
        row = IssuedCert.objects.get(pk=s)
        assert row.status == "revoked" and "laptop stolen" in row.revocation_reason
        assert AuditEvent.objects.filter(action="ca.cert.revoked", target_id=s, result="success",
                                         principal="root").exists()
    assert IssuedCert.objects.get(pk=other).status == "active"
    assert IssuedCert.objects.get(pk=fresh).status == "active"
    crl = x509.load_der_x509_crl(bytes(CrlVersion.objects.latest_published().der))
    listed = {format(r.serial_number, "X") for r in crl}
    assert {s.lstrip("0") for s in revoked} <= {s.lstrip("0") for s in listed} and other.lstrip("0") not in listed
    assert AuditEvent.objects.filter(action="agent.credential.revoked", target_id=agent_id).exists()


def test_a_connection_whose_credential_was_revoked_cannot_obtain_a_certificate():
    """Between a credential's revocation and the push (or heartbeat) that closes the agent's connection, the still
    open connection's cert.enroll is refused: a certificate issued then would be left active for a device the
    revocation cut off (revoke_agent_credential revokes the ones it finds, under the agent's row lock)."""
    token = mint_device_token()

    async def scenario():
        comm, agent_id, _, _ = await enrolled_agent(token)  # registered on its credential, no certificate yet
        await db(Agent.objects.filter(pk=agent_id).update)(credential_hash="")  # revoked; the push not yet there
        refused = await send(comm, {"type": "cert.enroll", "csr_pem": new_key()[1]})
        assert refused["type"] == "cert.refused", refused
        await comm.disconnect()
        return agent_id

    agent_id = __import__("asyncio").run(scenario())
    assert not IssuedCert.objects.filter(agent_id=agent_id).exists()
