"""PKI MCP tools (spec/pki.md §4): thin handlers over pki.services, which the REST views call too."""

from mcp.registry import tool
from mcp.schema import APPROVAL_ID, array, boolean, enum, integer, obj, string

from . import services
from .models import IssuedCert

SERIAL = string(64, "Certificate serial, hexadecimal (colons and case are ignored)", minLength=1,
                pattern="^[0-9A-Fa-f:]{1,64}$")
CERT = obj({"serial_hex": string(64), "subject": string(512), "san": string(1024),
            "purpose": enum(IssuedCert.PURPOSES), "status": enum((IssuedCert.ACTIVE, IssuedCert.REVOKED)),
            "not_after": integer(), "issued_at": integer(), "revoked_at": integer(),
            "revocation_reason": string(256), "issued_by": string(200), "issuer_key_id": string(64)}, additional=True)


@tool(name="list_issued_certs", title="List issued certificates", securable="Security", operation="Read",
      description="List certificates issued by the internal CA with serial, subject, purpose, status, expiry and "
                  "revocation details (paged). Times are epoch seconds; revoked_at is 0 while active. PEM is never "
                  "returned. An empty items list means the CA has issued nothing yet (or offset is past the end: see "
                  "count). Needs a fleet-wide Security:Read.",
      input_schema=obj({"limit": integer(1, 1000, "Page size (default 200)"),
                        "offset": integer(0, 10**9, "Rows to skip (default 0)")}),
      output_schema=obj({"items": array(CERT), "count": integer(), "limit": integer(), "offset": integer(),
                         "has_more": boolean(), "next_offset": integer()}, ["items", "count", "has_more"]))
def list_issued_certs(ctx, args):
    return services.list_issued_certs(ctx.principal, args.get("limit", 200), args.get("offset", 0))


@tool(name="revoke_certificate", title="Revoke a certificate", securable="Security", operation="Delete",
      effect="destructive", idempotent=False,
      prepare=lambda ctx, a, pinned=None: services.plan_revoke_certificate(ctx.principal, a["serial_hex"],
                                                                           a.get("reason", ""), pinned),
      description="Revoke a certificate by serial number and republish the CRL; needs human approval. An agent "
                  "whose certificate is revoked is disconnected at once and cannot reconnect; the agent's earlier "
                  "certificates still active (a renewal's predecessors) are revoked with it (also_revoked). An "
                  "unknown or already revoked serial is refused with no change (-32602). The server's own "
                  "https/server/gateway certificates cannot be revoked here. Approval-gated on the supervised tier: "
                  "the first call answers -32006 with an approval_id.",
      input_schema=obj({"serial_hex": SERIAL, "reason": string(256, "Why (audited; 'compromise' maps to the RFC "
                                                                     "5280 reason keyCompromise)"),
                        "approval_id": APPROVAL_ID}, ["serial_hex"]),
      output_schema=obj({"revoked": boolean(), "serial_hex": string(64), "also_revoked": array(string(64)),
                         "crl_republished": boolean()},
                        ["revoked", "serial_hex", "crl_republished"]))
def revoke_certificate(ctx, args):
    return services.revoke_certificate(ctx.principal, cid=ctx.cid, plan=ctx.plan)


@tool(name="issue_code_signing_cert", title="Issue a code-signing certificate", securable="Security",
      operation="Write", effect="additive", idempotent=False,
      prepare=lambda ctx, a, pinned=None: services.plan_issue_code_signing_cert(
          ctx.principal, a["csr_pem"], a["signer_name"], a["justification"], a.get("validity_days", 365), pinned),
      description="Issue a code-signing certificate from the internal CA for a submitted CSR, used to sign agent "
                  "plugins; needs human approval. The server sets the subject (CN=codesign:<signer_name>); the "
                  "CSR contributes only its EC P-256/P-384 key. EKU codeSigning only. Approval-gated on the "
                  "supervised tier: the first call answers -32006 with an approval_id, pinned to the CSR's key.",
      input_schema=obj({"csr_pem": string(16384, "PKCS#10 CSR, PEM", minLength=1),
                        "signer_name": string(63, "Who signs, e.g. release-team", minLength=1,
                                              pattern="^[a-z0-9][a-z0-9._-]{0,62}$"),
                        "validity_days": integer(1, 397, "Lifetime in days (default 365)"),
                        "justification": string(1024, "Why (audited)", minLength=1),
                        "approval_id": APPROVAL_ID}, ["csr_pem", "signer_name", "justification"]),
      output_schema=obj({"serial_hex": string(64), "subject": string(512), "not_after": integer(),
                         "cert_pem": string(16384), "chain_pem": string(16384), "purpose": string(16)},
                        ["serial_hex", "cert_pem", "purpose"]))
def issue_code_signing_cert(ctx, args):
    return services.issue_code_signing_cert(ctx.principal, cid=ctx.cid, plan=ctx.plan)
