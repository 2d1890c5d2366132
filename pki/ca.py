"""The internal CA (spec/pki.md §1, §3), on the ``cryptography`` package: created on first use, it issues
agent leaves (from a CSR, over the agent WebSocket) and code-signing leaves (an approved tool call), checks
an agent's proof of possession, and publishes CRLs.

The CA key is ECDSA P-384, sealed at rest with yuzu.secrets (pki.models.KEY) and unsealed per signature.
Every subject and SAN is set here; a CSR contributes its public key only, after its signature verifies."""

import base64
import hashlib
import secrets
from datetime import timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from django.db import IntegrityError, transaction
from django.utils import timezone

from yuzu import secrets as sealed
from yuzu.audit import audit
from yuzu.metrics import CA_CERT_ISSUED, CA_CRL_PUBLISH_FAILURES

from .models import KEY, CaRoot, CrlVersion, IssuedCert

CA_LIFETIME = timedelta(days=3650)
AGENT_LIFETIME = timedelta(days=365)
CRL_LIFETIME = timedelta(days=7)  # project decision: nextUpdate = thisUpdate + 7 days
CRL_REFRESH = timedelta(hours=24)  # republish when within this of nextUpdate
PROOF_CONTEXT = b"yuzu-agent-proof-v1\n"
NONCE_BYTES = 32
MAX_CSR_CHARS = 16384


class CertError(ValueError):
    """A CSR, certificate or proof that is not acceptable (the message says why, for the caller)."""


# --- the CA ----------------------------------------------------------------------------------------

def _spki_sha256(public_key):
    return hashlib.sha256(public_key.public_bytes(serialization.Encoding.DER,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo)).hexdigest()


def _create():
    key = ec.generate_private_key(ec.SECP384R1())
    now = timezone.now().replace(microsecond=0)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Yuzu Internal CA"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Yuzu")])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA384()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    ca = CaRoot(id=1, cert_pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
                fingerprint_sha256=cert.fingerprint(hashes.SHA256()).hex().upper(),
                key_id=_spki_sha256(key.public_key()), not_before=cert.not_valid_before_utc,
                not_after=cert.not_valid_after_utc)
    ca.key_sealed = sealed.seal(key_pem, KEY.where(1))
    return ca


def authority():
    """The CA row, created (and audited, and its first CRL published) on first use."""
    ca = CaRoot.objects.filter(pk=1).first()
    if ca is not None:
        return ca
    ca = _create()
    try:
        with transaction.atomic():
            ca.save(force_insert=True)
    except IntegrityError:  # another process created it first: theirs stands
        return CaRoot.objects.get(pk=1)
    audit("system", "ca.root.created", "success", target_type="CaRoot", target_id=ca.fingerprint_sha256,
          detail=f"algo={ca.algo} not_after={ca.not_after:%Y-%m-%d}")
    publish_crl()
    return ca


def ca_cert(ca=None):
    return x509.load_pem_x509_certificate((ca or authority()).cert_pem.encode())


def _ca_key(ca):
    """The CA private key, unsealed for one signature (the caller drops it)."""
    return serialization.load_pem_private_key(sealed.unseal(bytes(ca.key_sealed), KEY.where(1)), password=None)


# --- issuing ---------------------------------------------------------------------------------------

def normalise_serial(text):
    """Canonical serial: ':' and whitespace stripped, uppercase; 1–64 hex characters or CertError."""
    s = "".join(ch for ch in str(text) if ch != ":" and not ch.isspace()).upper()
    if not 1 <= len(s) <= 64 or any(ch not in "0123456789ABCDEF" for ch in s):
        raise CertError("serial_hex must be 1-64 hexadecimal characters")
    return s


def key_fingerprint(csr_or_cert):
    """SHA-256 of the public key (SubjectPublicKeyInfo), hex: what an approval of a CSR pins."""
    return _spki_sha256(csr_or_cert.public_key())


def serial_of(cert):
    return format(cert.serial_number, "X")


def load_csr(csr_pem, curves=(ec.SECP256R1,)):
    """A PKCS#10 CSR whose signature verifies and whose key is EC on one of ``curves``, or CertError."""
    if not isinstance(csr_pem, str) or len(csr_pem) > MAX_CSR_CHARS:
        raise CertError(f"csr_pem must be a PEM string of at most {MAX_CSR_CHARS} characters")
    try:
        csr = x509.load_pem_x509_csr(csr_pem.encode())
        key = csr.public_key()
    except (ValueError, UnsupportedAlgorithm):  # a key algorithm or curve the library does not know
        raise CertError("csr_pem is not a PEM certificate signing request with a key this CA reads") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, curves):
        raise CertError("the CSR key must be EC " + " or ".join(c.name for c in curves))
    if not csr.is_signature_valid:
        raise CertError("the CSR signature does not verify (no proof of possession of its key)")
    return csr


def _issue(csr, subject, uri, eku, lifetime, purpose, issued_by, note="", **record):
    ca = authority()
    issuer = ca_cert(ca)
    now = timezone.now().replace(microsecond=0)
    not_after = min(now + lifetime, ca.not_after)
    serial = secrets.randbits(127) | (1 << 126)  # random positive 127-bit, never zero
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer.subject).public_key(csr.public_key())
            .serial_number(serial).not_valid_before(now - timedelta(minutes=5)).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([eku]), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.public_key()), critical=False)
            .sign(_ca_key(ca), hashes.SHA384()))
    row = IssuedCert.objects.create(
        serial_hex=serial_of(cert), subject=subject.rfc4514_string(), san=f"URI:{uri}", purpose=purpose,
        not_after=cert.not_valid_after_utc, issued_at=now, issued_by=str(issued_by),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM).decode(), issuer_fingerprint=ca.fingerprint_sha256,
        issuer_key_id=ca.key_id, **record)
    CA_CERT_ISSUED.labels(purpose).inc()
    audit(str(issued_by), "ca.cert.issued", "success", target_type="IssuedCert", target_id=row.serial_hex,
          detail=f"purpose={purpose} serial={row.serial_hex} subject={row.subject}{note}")
    return row


def issue_agent_cert(agent_id, csr):
    """An agent's leaf: CN=<agent_id>, URI SAN yuzu://<ca-fingerprint>/agent/<agent_id>, EKU clientAuth."""
    fp = authority().fingerprint_sha256
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, agent_id)])
    return _issue(csr, subject, f"yuzu://{fp}/agent/{agent_id}", ExtendedKeyUsageOID.CLIENT_AUTH, AGENT_LIFETIME,
                  "agent", f"agent:{agent_id}", agent_id=agent_id)


def issue_code_signing_cert(csr, signer_name, validity_days, issued_by, justification=""):
    fp = authority().fingerprint_sha256
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"codesign:{signer_name}"),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Yuzu Code Signing")])
    return _issue(csr, subject, f"yuzu://{fp}/codesign/{signer_name}", ExtendedKeyUsageOID.CODE_SIGNING,
                  timedelta(days=validity_days), "code-signing", issued_by, f" justification={justification}",
                  signer_name=signer_name)


# --- proof of possession ---------------------------------------------------------------------------

def new_nonce():
    return secrets.token_hex(NONCE_BYTES)


def proof_message(nonce, agent_id):
    """What an agent signs to prove its key on one connection: bound to this nonce and this agent."""
    return PROOF_CONTEXT + nonce.encode() + b"\n" + agent_id.encode()


def verify_agent_proof(agent_id, cert_pem, proof_b64, nonce):
    """The connection's proof: the certificate chains to this CA, is a current agent leaf for ``agent_id``,
    is on record and not revoked (the store, not the CRL: revocation is immediate), and its key signed
    proof_message(nonce, agent_id). Returns the IssuedCert, or raises CertError saying why."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        proof = base64.b64decode(proof_b64, validate=True)
    except ValueError:
        raise CertError("the certificate or proof is not well-formed") from None
    ca = authority()
    try:
        cert.verify_directly_issued_by(ca_cert(ca))
    except (ValueError, TypeError, InvalidSignature):
        raise CertError("the certificate was not issued by this server's CA") from None
    now = timezone.now()
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise CertError("the certificate has expired or is not yet valid")
    row = IssuedCert.objects.filter(serial_hex=serial_of(cert)).first()
    if row is None or row.purpose != "agent" or row.agent_id != agent_id:
        raise CertError("the certificate is not this agent's")
    if row.status != IssuedCert.ACTIVE:
        raise CertError("the certificate has been revoked")
    try:
        cert.public_key().verify(proof, proof_message(nonce, agent_id), ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, TypeError):
        raise CertError("the proof of possession does not verify") from None
    return row


def active_serials(serials):
    """Those of ``serials`` whose certificate is still active (not revoked)."""
    if not serials:
        return set()
    return set(IssuedCert.objects.filter(pk__in=serials, status=IssuedCert.ACTIVE).values_list("pk", flat=True))


# --- the CRL -------------------------------------------------------------------------------------

def _reason(text):
    return x509.ReasonFlags.key_compromise if "compromise" in (text or "").lower() else x509.ReasonFlags.unspecified


def publish_crl():
    """Sign and record the next CRL (numbers allocated under the CA row's lock). Returns the CrlVersion, or
    None when it failed (audited, counted; the revocations stand regardless)."""
    try:
        with transaction.atomic():
            ca = CaRoot.objects.select_for_update().get(pk=1)
            issuer = ca_cert(ca)
            number = CrlVersion.objects.next_number()
            now = timezone.now().replace(microsecond=0)
            builder = (x509.CertificateRevocationListBuilder().issuer_name(issuer.subject).last_update(now)
                       .next_update(now + CRL_LIFETIME)
                       .add_extension(x509.CRLNumber(number), critical=False)
                       .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.public_key()),
                                      critical=False))
            for serial, at, reason in IssuedCert.objects.filter(status=IssuedCert.REVOKED).values_list(
                    "serial_hex", "revoked_at", "revocation_reason"):
                builder = builder.add_revoked_certificate(
                    x509.RevokedCertificateBuilder().serial_number(int(serial, 16)).revocation_date(at or now)
                    .add_extension(x509.CRLReason(_reason(reason)), critical=False).build())
            crl = builder.sign(_ca_key(ca), hashes.SHA384())
            row = CrlVersion.objects.create(version=number, der=crl.public_bytes(serialization.Encoding.DER),
                                            this_update=now, next_update=now + CRL_LIFETIME,
                                            issuer_fingerprint=ca.fingerprint_sha256, issuer_key_id=ca.key_id)
    except Exception as exc:  # noqa: BLE001 — any failure is recorded; the caller reports crl_republished:false
        CA_CRL_PUBLISH_FAILURES.inc()
        audit("system", "ca.crl.published", "failure", target_type="CrlVersion", detail=type(exc).__name__)
        return None
    audit("system", "ca.crl.published", "success", target_type="CrlVersion", target_id=number,
          detail=f"revoked={len(crl)} next_update={row.next_update:%Y-%m-%dT%H:%M:%SZ}")
    return row


def current_crl():
    """The latest published CRL, republished first when missing or within CRL_REFRESH of its nextUpdate
    (never signed per request otherwise)."""
    authority()
    row = CrlVersion.objects.latest_published()
    if row is None or row.next_update - timezone.now() < CRL_REFRESH:
        row = publish_crl() or row
    return row
