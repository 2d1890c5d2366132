"""The CA's capabilities, one service function each, shared by the MCP tools (pki.mcp_tools), the REST
views (pki.api) and the admin: list the issued certificates, revoke one, issue a code-signing certificate.
Each mutating capability has its one validation, ``plan_<capability>`` (yuzu.plans), run before any side
effect and again, with what the approval pinned, on the approved recall."""

from cryptography.hazmat.primitives.asymmetric import ec
from django.db import transaction

from fleet.push import send_to_agent
from yuzu import rbac
from yuzu.audit import audit
from yuzu.errors import YuzuError
from yuzu.plans import Plan

from . import ca
from .models import CaRoot, IssuedCert

MAX_ACTIVE_PER_SIGNER = 20


def _fleet_wide(principal, operation):
    """The CA is the whole install's: its certificates need a fleet-wide Security grant (a grant held on
    one management group does not reach them, nor does a service-scoped token)."""
    rbac.refuse_service_scoped(principal, "Security", operation)
    if not rbac.may(principal, "Security", operation):
        raise rbac.denial(principal, "Security", operation)


def list_issued_certs(principal, limit=200, offset=0):
    _fleet_wide(principal, "Read")
    ca.authority()
    rows = list(IssuedCert.objects.all()[offset:offset + limit + 1])
    more = len(rows) > limit
    out = {"items": [r.to_dict() for r in rows[:limit]], "count": min(len(rows), limit), "limit": limit,
           "offset": offset, "has_more": more}
    if more:
        out["next_offset"] = offset + limit
    return out


# --- revoke ----------------------------------------------------------------------------------------

def plan_revoke_certificate(principal, serial_hex, reason="", pinned=None):
    _fleet_wide(principal, "Delete")
    try:
        serial = ca.normalise_serial(serial_hex)
    except ca.CertError as exc:
        raise YuzuError(str(exc)) from None
    if pinned and pinned.get("certificates") != [serial]:
        raise YuzuError("the approval was for another certificate")
    row = IssuedCert.objects.filter(pk=serial, status=IssuedCert.ACTIVE).first()
    if row is None:
        audit(principal, "ca.cert.revoked", "denied", target_type="IssuedCert", target_id=serial,
              detail="certificate not found or already revoked")
        raise YuzuError("certificate not found or already revoked", remediation="list_issued_certs shows the "
                        "active serials; nothing was changed")
    if row.purpose in IssuedCert.SERVER_PURPOSES:
        raise YuzuError(f"a '{row.purpose}' certificate is the server's own; rotate it by regenerating the "
                        "default certificates instead of revoking it")
    what = f"agent {row.agent_id}" if row.purpose == "agent" else row.subject
    earlier = list(row.earlier_of_agent().values_list("serial_hex", flat=True)) if row.purpose == "agent" else []
    also = f" and the agent's earlier active certificate(s) {', '.join(earlier)}" if earlier else ""
    return Plan(summary=f"Revoke certificate {serial} ({row.purpose}, {what}){also}"
                + (f": {reason}" if reason else ""), value=(row, reason or ""),
                pins={"certificates": [serial]}, risk="destructive",
                facts={"purpose": row.purpose, "subject": row.subject, "reason": reason or ""})


def revoke_certificate(principal, serial_hex=None, reason="", *, cid="", plan=None):
    """Revoke the certificate; for an agent's, also the agent's earlier ones still active (``also_revoked``). A
    renewal leaves the certificate it replaces active until it runs out (the agent may not have stored the new
    one yet), so revoking the agent's newest left the old key admitted for up to a third of a year."""
    row, reason = (plan or plan_revoke_certificate(principal, serial_hex, reason)).value
    with transaction.atomic():
        if not row.revoke(reason):
            raise YuzuError("certificate not found or already revoked")
        earlier = list(row.earlier_of_agent()) if row.purpose == "agent" else []
        also = [r for r in earlier if r.revoke(f"{reason} (replaced by {row.serial_hex}, revoked with it)")]
    published = _revoked(principal, [row, *also], cid)
    return {"revoked": True, "serial_hex": row.serial_hex, "also_revoked": [r.serial_hex for r in also],
            "crl_republished": published}


def active_agent_certs(agent_id):
    """The agent's certificates still valid (purpose agent, active, not yet run out), oldest first."""
    return IssuedCert.objects.active().filter(purpose="agent", agent_id=agent_id).order_by("issued_at", "serial_hex")


def revoke_agent_certificates(principal, agent_id, reason="", *, cid=""):
    """Revoke every certificate of the agent still valid, as ``revoke_certificate`` revokes one: each audited
    ``ca.cert.revoked``, the agent's connection that proved one closed, the CRL republished (only when one was
    revoked). For fleet.services.revoke_agent_credential, inside its transaction: the credential and the
    certificates go together. → {"certificates_revoked": [serial, …], "crl_republished": bool}"""
    _fleet_wide(principal, "Delete")
    with transaction.atomic():
        rows = [r for r in active_agent_certs(agent_id).select_for_update() if r.revoke(reason)]
    published = _revoked(principal, rows, cid) if rows else False
    return {"certificates_revoked": [r.serial_hex for r in rows], "crl_republished": published}


def _revoked(principal, rows, cid):
    """What follows revoking ``rows``: an audit row each, an agent's live connection closed, the CRL republished.
    → whether the CRL was."""
    for r in rows:
        audit(principal, "ca.cert.revoked", "success", target_type="IssuedCert", target_id=r.serial_hex,
              detail=f"purpose={r.purpose} serial={r.serial_hex} reason={r.revocation_reason}", correlation_id=cid)
        if r.purpose == "agent":
            # The agent's live connection closes now (fleet.consumers.AgentConsumer.agent_revoked); its
            # heartbeat re-checks the store as well, so a lost message costs at most one heartbeat.
            send_to_agent(r.agent_id, {"type": "agent.revoked", "serial_hex": r.serial_hex})
    return ca.publish_crl() is not None


# --- issue a code-signing certificate ---------------------------------------------------------------

def _within_cap(signer_name):
    active = IssuedCert.objects.active().filter(purpose="code-signing", signer_name=signer_name).count()
    if active >= MAX_ACTIVE_PER_SIGNER:
        raise YuzuError(f"signer '{signer_name}' already has {active} active code-signing certificates; revoke old "
                        "ones first")


def plan_issue_code_signing_cert(principal, csr_pem, signer_name, justification, validity_days=365, pinned=None):
    _fleet_wide(principal, "Write")
    try:
        csr = ca.load_csr(csr_pem, curves=(ec.SECP256R1, ec.SECP384R1))
    except ca.CertError as exc:
        raise YuzuError(str(exc)) from None
    _within_cap(signer_name)
    fingerprint = ca.key_fingerprint(csr)
    if pinned and pinned.get("csr_key") != fingerprint:
        raise YuzuError("the approval was for another CSR")
    return Plan(summary=f"Issue a code-signing certificate CN=codesign:{signer_name} valid {validity_days} days "
                        f"(key {fingerprint[:16]}…): {justification}",
                value=(csr, signer_name, validity_days, justification), pins={"csr_key": fingerprint},
                risk="additive", facts={"signer_name": signer_name, "validity_days": validity_days,
                                        "justification": justification, "csr_key_sha256": fingerprint})


def issue_code_signing_cert(principal, *, cid="", plan):
    csr, signer_name, validity_days, justification = plan.value
    ca.authority()
    with transaction.atomic():
        # Code-signing issues one at a time (the CA row locked), the cap counted again: issues at once each
        # counted before the others had written, and together went past it.
        CaRoot.objects.select_for_update().get(pk=1)
        _within_cap(signer_name)
        row = ca.issue_code_signing_cert(csr, signer_name, validity_days, principal.name, justification)
    return {"serial_hex": row.serial_hex, "subject": row.subject, "not_after": int(row.not_after.timestamp()),
            "cert_pem": row.cert_pem, "chain_pem": ca.authority().cert_pem, "purpose": "code-signing"}
