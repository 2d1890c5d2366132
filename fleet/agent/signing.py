"""Code signing on the agent (spec/pki.md §4): what the agent runs may carry a detached signature made with a
code-signing certificate of the server's CA, and an agent configured to require one refuses what is unsigned,
tampered with, or signed by a revoked or foreign signer — with a REJECTED answer that says why.

A signature is base64 of an ECDSA-SHA256 signature (DER) over the content's bytes; for ``script.run`` the
content is the ``argv`` parameter exactly as sent. It is what ``openssl dgst -sha256 -sign key.pem`` writes, so
a release pipeline can sign without this module (``python -m fleet.agent.signing sign`` does the same).

Rules, from the config keys ``trust_bundle`` (the CA PEM, from GET /api/v1/ca/root) and
``require_signature``:
- no bundle → no checks;
- bundle and a signature → it must verify (chain to the bundle, EKU codeSigning, within validity, not on the
  CA's CRL, the signature over the content), or the command is rejected;
- bundle, no signature, require_signature off → runs;
- bundle, no signature, require_signature on → rejected;
- require_signature without a bundle → the agent refuses to start (client.AgentClient).

The CRL comes from the server (``GET /api/v1/ca/crl``), verified against the bundle, cached for
``crl_max_age`` seconds (default 3600: the hourly fetch); without a current CRL signed content is refused
(fail closed)."""

import argparse
import base64
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime
from urllib.parse import urlsplit, urlunsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

CRL_PATH = "/api/v1/ca/crl"
SIGNED_PLUGINS = {"script.run": "argv"}  # plugin.action → the parameter whose value is signed


class SignatureError(Exception):
    """The content may not run: the message says why (sent back as the REJECTED error)."""


def crl_url(server):
    """The CRL's URL on the server the agent talks to (ws → http, wss → https)."""
    parts = urlsplit(server)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, CRL_PATH, "", ""))


def sign(content, key_pem):
    key = serialization.load_pem_private_key(key_pem, password=None)
    return base64.b64encode(key.sign(content, ec.ECDSA(hashes.SHA256()))).decode()


class Verifier:
    """The agent's trust: the bundle, and the CRL it fetches and caches."""

    def __init__(self, trust_pem, server, crl_max_age=3600, fetch=None):
        self.roots = x509.load_pem_x509_certificates(trust_pem)
        self.url = crl_url(server)
        self.max_age = float(crl_max_age)
        self.fetch = fetch or self._fetch
        self.crl, self.fetched_at = None, 0.0
        self.lock = threading.Lock()

    def _fetch(self):
        with urllib.request.urlopen(self.url, timeout=10) as r:  # noqa: S310 — the configured server
            return r.read(1024 * 1024)

    def current_crl(self):
        with self.lock:
            if self.crl is None or time.monotonic() - self.fetched_at > self.max_age:
                try:
                    crl = x509.load_der_x509_crl(self.fetch())
                except (OSError, ValueError) as exc:
                    if self.crl is None:
                        raise SignatureError(f"cannot check revocation: the CRL is unavailable ({exc})") from None
                    return self.crl  # keep the one we have until it expires (checked below)
                if not any(crl.is_signature_valid(root.public_key()) for root in self.roots
                           if crl.issuer == root.subject):
                    raise SignatureError("the CRL is not signed by the trusted CA")
                self.crl, self.fetched_at = crl, time.monotonic()
            if self.crl.next_update_utc is not None and self.crl.next_update_utc < datetime.now(UTC):
                raise SignatureError("cannot check revocation: the CRL has expired")
            return self.crl

    def verify(self, content, signature_b64, signer_cert_pem):
        """Raise SignatureError unless ``content`` is signed by a current, unrevoked code-signing cert of the CA."""
        try:
            cert = x509.load_pem_x509_certificate(signer_cert_pem.encode())
            signature = base64.b64decode(signature_b64, validate=True)
        except ValueError:
            raise SignatureError("signature rejected: the signature or signer certificate is malformed") from None
        if not any(_issued_by(cert, root) for root in self.roots):
            raise SignatureError("signature rejected: the signer is not certified by the trusted CA")
        try:
            usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        except x509.ExtensionNotFound:
            usages = []
        if ExtendedKeyUsageOID.CODE_SIGNING not in usages:
            raise SignatureError("signature rejected: the signer certificate is not a code-signing certificate")
        now = datetime.now(UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise SignatureError("signature rejected: the signer certificate has expired or is not yet valid")
        if self.current_crl().get_revoked_certificate_by_serial_number(cert.serial_number) is not None:
            raise SignatureError(f"signature rejected: the signer certificate {cert.serial_number:X} is revoked")
        try:
            cert.public_key().verify(signature, content, ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, TypeError):
            raise SignatureError("signature rejected: the content does not match its signature "
                                 "(changed after signing, or signed by another key)") from None


def _issued_by(cert, root):
    try:
        cert.verify_directly_issued_by(root)
        return True
    except (ValueError, TypeError, InvalidSignature):
        return False


def check_command(verifier, require, name, params):
    """The signing rules for one command (see the module docstring); raises SignatureError to refuse it."""
    field = SIGNED_PLUGINS.get(name)
    if verifier is None or field is None:
        return
    signature, signer = params.get("signature"), params.get("signer_cert")
    if not signature and not signer:
        if require:
            raise SignatureError(f"signature required: this agent runs only signed {name} commands "
                                 "(add 'signature' and 'signer_cert')")
        return
    if not signature or not signer:
        raise SignatureError("signature rejected: 'signature' and 'signer_cert' go together")
    verifier.verify(params[field].encode(), signature, signer)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fleet.agent.signing",
                                     description="Sign a script.run argv with a code-signing key.")
    parser.add_argument("--key", required=True, help="the code-signing private key (PEM)")
    parser.add_argument("content", help="the exact argv parameter to sign")
    args = parser.parse_args(argv)
    with open(args.key, "rb") as f:
        print(sign(args.content.encode(), f.read()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
