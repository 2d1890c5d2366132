"""Code signing on the agent (fleet.agent.signing, AgentClient.execute) against certificates and CRLs of the
real CA: a signed script runs; one changed byte, a revoked signer, a foreign CA, a non-code-signing
certificate or a missing signature (when required) are answered REJECTED with the reason, never a crash."""

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fleet.agent import signing
from fleet.agent.client import AgentClient, Refused
from fleet.agent.plugins import Context
from pki import ca, services
from tests.pki.test_ca import csr_for, forged, keypair, pem

pytestmark = pytest.mark.django_db
ARGV = '["echo", "signed hello"]'


def key_pem(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@pytest.fixture
def signer():
    key = keypair()
    row = ca.issue_code_signing_cert(ca.load_csr(csr_for(key), (ec.SECP256R1,)), "release", 30, "test")
    return key, row


@pytest.fixture
def agent(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text(ca.authority().cert_pem)

    def make(require=True, **config):
        client = AgentClient("ws://127.0.0.1:1", state_dir=tmp_path / "state", config={
            "trust_bundle": str(bundle), "require_signature": require, "crl_max_age": 0,
            "script_allow": [["echo", "**"]], **config})
        client.verifier.fetch = lambda: bytes(ca.current_crl().der)  # the CRL the server would serve
        return client

    return make


def run(client, params):
    return client.execute("script", "run", params, Context(config=client.config))


def signed(key, row, argv=ARGV):
    return {"argv": argv, "signature": signing.sign(argv.encode(), key_pem(key)), "signer_cert": row.cert_pem}


def test_signed_script_runs_and_tampered_one_is_refused(signer, agent):
    key, row = signer
    client = agent()
    ok = run(client, signed(key, row))
    assert ok.status == "SUCCESS" and "signed hello" in ok.output
    tampered = {**signed(key, row), "argv": ARGV.replace("hello", "hellp")}  # one byte
    r = run(client, tampered)
    assert r.status == "REJECTED" and "does not match its signature" in r.error


def test_unsigned_script_refused_only_when_required(agent):
    r = run(agent(require=True), {"argv": ARGV})
    assert r.status == "REJECTED" and "signature required" in r.error
    assert run(agent(require=False), {"argv": ARGV}).status == "SUCCESS"


def test_revoked_signer_refused(signer, agent, principal):
    key, row = signer
    client = agent()
    assert run(client, signed(key, row)).status == "SUCCESS"
    services.revoke_certificate(principal("root", "Administrator"), row.serial_hex, "key compromise")
    r = run(client, signed(key, row))
    assert r.status == "REJECTED" and "revoked" in r.error


def test_agent_certificate_and_foreign_ca_cannot_sign(agent):
    key = keypair()
    leaf = ca.issue_agent_cert("a" * 32, ca.load_csr(csr_for(key)))
    r = run(agent(), signed(key, leaf))
    assert r.status == "REJECTED" and "not a code-signing certificate" in r.error

    foreign = forged("codesign:x", key, keypair(ec.SECP384R1))
    r = run(agent(), {**signed(key, leaf), "signer_cert": pem(foreign)})
    assert r.status == "REJECTED" and "not certified by the trusted CA" in r.error
    r = run(agent(), {**signed(key, leaf), "signature": "AAAA", "signer_cert": "junk"})
    assert r.status == "REJECTED" and "malformed" in r.error


def test_unreachable_crl_fails_closed(signer, agent):
    key, row = signer
    client = agent()

    def down():
        raise OSError("connection refused")

    client.verifier.fetch = down
    r = run(client, signed(key, row))
    assert r.status == "REJECTED" and "CRL is unavailable" in r.error


def test_require_signature_without_a_bundle_refuses_to_start(tmp_path):
    with pytest.raises(Refused, match="trust_bundle"):
        AgentClient("ws://127.0.0.1:1", state_dir=tmp_path, config={"require_signature": True})
