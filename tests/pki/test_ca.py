"""The internal CA in process (pki.ca, pki.services, the PKI tools and routes): the CA key sealed at rest,
what a leaf carries whatever the CSR asks, proof of possession and what a forged, expired, foreign or
revoked certificate gets, the CRL, revocation through the approval gate, code-signing issuance."""

import base64
from datetime import timedelta
from functools import partial

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from django.test import Client
from django.utils import timezone

from approvals.models import Approval
from pki import ca, services
from pki.models import CaRoot, CrlVersion, IssuedCert
from tests.support.approvals import approve, error_of, result_of
from tests.support.mcp_http import McpClient
from tests.support.races import at_once
from yuzu.errors import PermissionDenied, YuzuError
from yuzu.models import AuditEvent

pytestmark = pytest.mark.django_db


def keypair(curve=ec.SECP256R1):
    return ec.generate_private_key(curve())


def csr_for(key, cn="evil", san="admin.example"):
    return (x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False)
            .sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode())


def unknown_algorithm_csrs():
    """CSRs the library parses but cannot read the key of: an unknown public-key algorithm, an unknown curve (the
    id-ecPublicKey and P-256 OIDs of a real CSR's DER, one arc changed)."""
    der = x509.load_pem_x509_csr(csr_for(keypair()).encode()).public_bytes(serialization.Encoding.DER)
    out = []
    for old, new in (("06072a8648ce3d0201", "06072a8648ce3d0209"), ("06082a8648ce3d030107", "06082a8648ce3d030109")):
        body = base64.encodebytes(der.replace(bytes.fromhex(old), bytes.fromhex(new))).decode()
        out.append(f"-----BEGIN CERTIFICATE REQUEST-----\n{body}-----END CERTIFICATE REQUEST-----\n")
    return out


def pem(cert):
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def prove(key, nonce, agent_id):
    return base64.b64encode(key.sign(ca.proof_message(nonce, agent_id), ec.ECDSA(hashes.SHA256()))).decode()


def agent_leaf(agent_id="a" * 32):
    key = keypair()
    row = ca.issue_agent_cert(agent_id, ca.load_csr(csr_for(key)))
    return key, row


# --- the CA ------------------------------------------------------------------------------------------

def test_ca_created_once_key_sealed_and_audited(settings):
    first = ca.authority()
    assert ca.authority().pk == first.pk and CaRoot.objects.count() == 1
    cert = ca.ca_cert(first)
    assert isinstance(cert.public_key().curve, ec.SECP384R1)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.not_valid_after_utc - cert.not_valid_before_utc > timedelta(days=3649)
    blob = bytes(first.key_sealed)
    assert b"PRIVATE KEY" not in blob  # sealed, not PEM
    key = serialization.load_pem_private_key(
        __import__("yuzu.secrets", fromlist=["unseal"]).unseal(blob, ca.KEY.where(1)), None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()
    assert AuditEvent.objects.filter(action="ca.root.created").count() == 1
    assert CrlVersion.objects.count() == 1  # the first CRL is published with the CA


def test_agent_leaf_ignores_csr_subject_and_san():
    key, row = agent_leaf("b" * 32)
    cert = x509.load_pem_x509_certificate(row.cert_pem.encode())
    assert cert.subject.rfc4514_string() == "CN=" + "b" * 32
    uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [u.value for u in uris] == [f"yuzu://{ca.authority().fingerprint_sha256}/agent/{'b' * 32}"]
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH]
    assert timedelta(days=364) < cert.not_valid_after_utc - cert.not_valid_before_utc < timedelta(days=366)
    assert row.serial_hex == row.serial_hex.upper() and ":" not in row.serial_hex
    assert row.purpose == "agent" and row.agent_id == "b" * 32
    assert AuditEvent.objects.filter(action="ca.cert.issued", target_id=row.serial_hex).exists()


@pytest.mark.parametrize("bad", ["", "not pem", "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE "
                                                  "REQUEST-----\n", "x" * 20000])
def test_bad_csr_refused(bad):
    with pytest.raises(ca.CertError):
        ca.load_csr(bad)


def test_csr_key_type_and_signature_checked():
    rsa_csr = (x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
               .sign(rsa.generate_private_key(65537, 2048), hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    with pytest.raises(ca.CertError, match="EC"):
        ca.load_csr(rsa_csr.decode())
    with pytest.raises(ca.CertError, match="EC"):
        ca.load_csr(csr_for(keypair(ec.SECP384R1)))  # agents use P-256
    good = csr_for(keypair())
    tampered = x509.load_pem_x509_csr(good.encode())
    der = bytearray(tampered.public_bytes(serialization.Encoding.DER))
    der[-5] ^= 1  # inside the signature
    bad = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM).decode()
    with pytest.raises(ca.CertError):
        ca.load_csr(bad)


# --- proof of possession ---------------------------------------------------------------------------------

def test_proof_accepts_the_holder_only():
    agent_id = "c" * 32
    key, row = agent_leaf(agent_id)
    nonce = ca.new_nonce()
    assert ca.verify_agent_proof(agent_id, row.cert_pem, prove(key, nonce, agent_id), nonce).pk == row.pk
    with pytest.raises(ca.CertError, match="proof"):  # another key, or another nonce
        ca.verify_agent_proof(agent_id, row.cert_pem, prove(keypair(), nonce, agent_id), nonce)
    with pytest.raises(ca.CertError, match="proof"):
        ca.verify_agent_proof(agent_id, row.cert_pem, prove(key, ca.new_nonce(), agent_id), nonce)
    with pytest.raises(ca.CertError, match="not this agent"):  # someone else's certificate
        ca.verify_agent_proof("d" * 32, row.cert_pem, prove(key, nonce, "d" * 32), nonce)
    with pytest.raises(ca.CertError, match="not well-formed"):
        ca.verify_agent_proof(agent_id, "garbage", "!!", nonce)


def forged(subject_cn, key, issuer_key=None, days=(-1, 30)):
    """A certificate for ``subject_cn`` signed by ``issuer_key`` (default: its own key), named like our CA."""
    now = timezone.now()
    issuer = ca.ca_cert().subject
    return (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
            .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now + timedelta(days=days[0])).not_valid_after(now + timedelta(days=days[1]))
            .sign(issuer_key or key, hashes.SHA256()))


def test_forged_and_expired_certificates_refused():
    agent_id = "e" * 32
    agent_leaf(agent_id)
    key, nonce = keypair(), ca.new_nonce()
    with pytest.raises(ca.CertError, match="not issued by this server's CA"):
        ca.verify_agent_proof(agent_id, pem(forged(agent_id, key, keypair(ec.SECP384R1))), prove(key, nonce, agent_id),
                              nonce)
    # Signed by the real CA key but expired (as if issued long ago): refused on its dates.
    ca_key = ca._ca_key(ca.authority())
    expired = forged(agent_id, key, ca_key, days=(-400, -1))
    IssuedCert.objects.create(serial_hex=ca.serial_of(expired), subject="CN=x", purpose="agent", agent_id=agent_id,
                              not_after=expired.not_valid_after_utc, issued_by="test", cert_pem=pem(expired),
                              issuer_fingerprint="", issuer_key_id="")
    with pytest.raises(ca.CertError, match="expired"):
        ca.verify_agent_proof(agent_id, pem(expired), prove(key, nonce, agent_id), nonce)
    # Signed by the real CA key, valid, but never recorded (e.g. a key stolen from a backup): refused.
    unrecorded = forged(agent_id, key, ca_key)
    with pytest.raises(ca.CertError, match="not this agent"):
        ca.verify_agent_proof(agent_id, pem(unrecorded), prove(key, nonce, agent_id), nonce)


# --- revocation, the CRL ------------------------------------------------------------------------------------

def test_revoke_republishes_crl_and_refuses_the_proof(principal):
    admin = principal("root", "Administrator")
    agent_id = "f" * 32
    key, row = agent_leaf(agent_id)
    before = CrlVersion.objects.latest_published().version
    out = services.revoke_certificate(admin, row.serial_hex.lower(), "key compromise on the host")
    assert out == {"revoked": True, "serial_hex": row.serial_hex, "also_revoked": [],
                   "crl_republished": True}
    crl_row = CrlVersion.objects.latest_published()
    assert crl_row.version == before + 1
    crl = x509.load_der_x509_crl(bytes(crl_row.der))
    assert crl.is_signature_valid(ca.ca_cert().public_key())
    entry = crl.get_revoked_certificate_by_serial_number(int(row.serial_hex, 16))
    assert entry.extensions.get_extension_for_class(x509.CRLReason).value.reason == x509.ReasonFlags.key_compromise
    assert crl.next_update_utc - crl.last_update_utc == timedelta(days=7)
    nonce = ca.new_nonce()
    with pytest.raises(ca.CertError, match="revoked"):
        ca.verify_agent_proof(agent_id, row.cert_pem, prove(key, nonce, agent_id), nonce)
    assert AuditEvent.objects.filter(action="ca.cert.revoked", result="success", target_id=row.serial_hex).exists()
    # again: refused, nothing changes, audited as denied
    with pytest.raises(YuzuError, match="not found or already revoked"):
        services.revoke_certificate(admin, row.serial_hex, "again")
    assert CrlVersion.objects.latest_published().version == before + 1
    assert AuditEvent.objects.filter(action="ca.cert.revoked", result="denied").exists()


def test_server_leaves_cannot_be_revoked_and_serials_normalised(principal):
    admin = principal("root", "Administrator")
    _, row = agent_leaf()
    IssuedCert.objects.filter(pk=row.pk).update(purpose="https")
    with pytest.raises(YuzuError, match="server's own"):
        services.revoke_certificate(admin, row.serial_hex)
    assert ca.normalise_serial(" ab:cd ") == "ABCD"
    for bad in ("", "xyz", "A" * 65):
        with pytest.raises(ca.CertError):
            ca.normalise_serial(bad)


def test_group_held_security_grant_does_not_reach_the_ca(principal):
    from fleet.models import ManagementGroup
    g = ManagementGroup.objects.create(name="g")
    owner = principal("owner", "ITServiceOwner", group=g)
    with pytest.raises(PermissionDenied):
        services.list_issued_certs(owner)


def test_public_routes_and_paging(principal):
    c = Client()
    r = c.get("/api/v1/ca/root")
    assert r.status_code == 200 and r.content.startswith(b"-----BEGIN CERTIFICATE-----")
    r = c.get("/api/v1/ca/crl")
    assert r.status_code == 200 and r["Content-Type"] == "application/pkix-crl"
    x509.load_der_x509_crl(r.content)
    versions = CrlVersion.objects.count()
    c.get("/api/v1/ca/crl")
    assert CrlVersion.objects.count() == versions  # never signed per request
    for i in range(3):
        agent_leaf(f"{i:032x}")
    admin = principal("root", "Administrator")
    page = services.list_issued_certs(admin, limit=2)
    assert page["count"] == 2 and page["has_more"] and page["next_offset"] == 2
    assert "cert_pem" not in page["items"][0]
    last = services.list_issued_certs(admin, limit=2, offset=2)
    assert last["count"] == 1 and not last["has_more"] and "next_offset" not in last


# --- through MCP: the approval flow ----------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_revoke_through_the_gate_is_pinned(mint, approver):
    _, row = agent_leaf()
    _, other = agent_leaf("1" * 32)
    raw = mint("sam", "Administrator", tier="supervised")
    mcp = McpClient(raw)
    mcp.initialize()
    err = error_of(mcp.call("revoke_certificate", {"serial_hex": row.serial_hex, "reason": "stolen laptop"}))
    assert err["code"] == -32006
    approval_id = err["data"]["approval_id"]
    assert IssuedCert.objects.get(pk=row.pk).status == "active"  # nothing before approval
    approve(approver, approval_id)
    # the approval is for this serial only
    err = error_of(mcp.call("revoke_certificate", {"serial_hex": other.serial_hex, "approval_id": approval_id}))
    assert err["code"] != -32006 and IssuedCert.objects.get(pk=other.pk).status == "active"
    out = result_of(mcp.call("revoke_certificate", {"serial_hex": row.serial_hex, "reason": "stolen laptop",
                                                    "approval_id": approval_id}))["structuredContent"]
    assert out["revoked"] and out["crl_republished"]
    assert IssuedCert.objects.get(pk=row.pk).status == "revoked"
    assert Approval.objects.get(pk=approval_id).status != Approval.PENDING


@pytest.mark.django_db(transaction=True)
def test_malformed_serial_mints_no_ticket(mint):
    mcp = McpClient(mint("sam", "Administrator", tier="supervised"))
    mcp.initialize()
    for bad in ("zz", "A" * 65, ""):
        assert error_of(mcp.call("revoke_certificate", {"serial_hex": bad}))["code"] == -32602
    assert error_of(mcp.call("revoke_certificate", {"serial_hex": "ABCDEF"}))["code"] == -32602  # unknown
    assert not Approval.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_issue_code_signing_cert(mint, approver):
    raw = mint("rel", "Administrator", tier="supervised")
    mcp = McpClient(raw)
    mcp.initialize()
    key = keypair(ec.SECP384R1)
    args = {"csr_pem": csr_for(key, cn="a" * 32), "signer_name": "release-team", "validity_days": 30,
            "justification": "sign the patch scripts"}
    assert error_of(mcp.call("issue_code_signing_cert", {**args, "signer_name": "Bad:Name"}))["code"] == -32602
    assert error_of(mcp.call("issue_code_signing_cert", {**args, "csr_pem": "nope"}))["code"] == -32602
    assert not Approval.objects.exists()
    err = error_of(mcp.call("issue_code_signing_cert", args))
    assert err["code"] == -32006
    approve(approver, err["data"]["approval_id"])
    # the approval pins the CSR's key: another CSR under the same ticket is refused
    swapped = {**args, "csr_pem": csr_for(keypair()), "approval_id": err["data"]["approval_id"]}
    assert error_of(mcp.call("issue_code_signing_cert", swapped))["code"] != -32006
    assert not IssuedCert.objects.filter(purpose="code-signing").exists()
    recall = {**args, "approval_id": err["data"]["approval_id"]}
    out = result_of(mcp.call("issue_code_signing_cert", recall))["structuredContent"]
    cert = x509.load_pem_x509_certificate(out["cert_pem"].encode())
    assert cert.subject.rfc4514_string() == "O=Yuzu Code Signing,CN=codesign:release-team"
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CODE_SIGNING]
    assert cert.public_key().public_numbers() == key.public_key().public_numbers()
    assert out["chain_pem"] == ca.authority().cert_pem and out["purpose"] == "code-signing"
    row = IssuedCert.objects.get(pk=out["serial_hex"])
    assert row.issued_by == "rel" and row.signer_name == "release-team"


@pytest.mark.django_db(transaction=True)
def test_issues_at_once_for_one_signer_stay_within_its_cap(mint, monkeypatch):
    """Each issue counted the signer's active certificates before the others had written theirs: at the cap less
    one, three issues at once all passed and the signer held two more than the cap."""
    monkeypatch.setattr(services, "MAX_ACTIVE_PER_SIGNER", 1)
    raw = mint("rel", "Administrator")
    ca.authority()

    def issue(signer):
        body = {"csr_pem": csr_for(keypair()), "signer_name": signer, "validity_days": 30, "justification": "j"}
        return Client(HTTP_AUTHORIZATION=f"Bearer {raw}", raise_request_exception=False).post(
            "/api/v1/ca/issue", body, content_type="application/json")

    for n in range(5):  # three at once went through in the first round on PostgreSQL
        signer = f"release-{n}"
        answers = at_once(*[partial(issue, signer)] * 3)
        assert sorted(r.status_code for _, r in answers) == [201, 400, 400], [r.content[:200] for _, r in answers]
        assert IssuedCert.objects.filter(signer_name=signer).count() == 1


def test_crl_refresh_near_next_update_and_the_expiring_metric(principal):
    from prometheus_client import REGISTRY

    from pki.tasks import refresh_crl
    refresh_crl()  # no CA yet: nothing is created by the background check
    assert not CaRoot.objects.exists()
    ca.authority()
    first = CrlVersion.objects.latest_published()
    refresh_crl()
    assert CrlVersion.objects.latest_published().pk == first.pk  # a week left: nothing to do
    CrlVersion.objects.filter(pk=first.pk).update(next_update=timezone.now() + timedelta(hours=20))
    refresh_crl()
    assert CrlVersion.objects.latest_published().version == first.version + 1
    _, row = agent_leaf()
    assert REGISTRY.get_sample_value("yuzu_server_ca_certs_expiring_14d") == 0
    IssuedCert.objects.filter(pk=row.pk).update(not_after=timezone.now() + timedelta(days=10))
    assert REGISTRY.get_sample_value("yuzu_server_ca_certs_expiring_14d") == 1


def test_a_kek_rotation_rewraps_the_ca_key_and_it_still_signs():
    from yuzu import secrets

    ca.authority()
    old = secrets.kek_version_of(bytes(CaRoot.objects.get().key_sealed))
    new = secrets.create_version()
    assert secrets.rewrap_all(new) >= 1
    assert secrets.kek_version_of(bytes(CaRoot.objects.get().key_sealed)) == new != old
    _, row = agent_leaf()  # signed with the re-wrapped key
    x509.load_pem_x509_certificate(row.cert_pem.encode()).verify_directly_issued_by(ca.ca_cert())
