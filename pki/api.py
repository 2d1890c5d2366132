"""REST faces of the CA (spec/pki.md §5): the public CA certificate and CRL, and the twins of the PKI tools."""

from django.http import HttpResponse
from django.views.decorators.http import require_GET
from rest_framework.decorators import api_view

from yuzu import rbac
from yuzu.api.contract import contract, payload, tool_input, tool_output
from yuzu.api.envelope import cid_of, ok
from yuzu.api.views import int_param, principal_of

from . import ca, services

REVOKE = tool_input("revoke_certificate")
ISSUE = tool_input("issue_code_signing_cert")


@require_GET
def root_view(request):
    """The CA certificate (PEM): public, what agents and plugin signers trust."""
    return HttpResponse(ca.authority().cert_pem, content_type="application/x-pem-file")


@require_GET
def crl_view(request):
    """The latest published CRL (DER): public; republished only when missing or near its nextUpdate."""
    row = ca.current_crl()
    resp = HttpResponse(bytes(row.der), content_type="application/pkix-crl")
    resp["Cache-Control"] = "max-age=300"
    return resp


@contract("GET", "Certificates issued by the internal CA (newest first)", response=tool_output("list_issued_certs"),
          query=[("limit", int, "1-1000, default 200"), ("offset", int, "default 0")])
@api_view(["GET"])
def issued_view(request):
    p = principal_of(request)
    rbac.check(p, "Security", "Read", any_scope=True)
    return ok(services.list_issued_certs(p, int_param(request, "limit", 200, 1, 1000),
                                         int_param(request, "offset", 0, 0, 10**9)))


@contract("POST", "Revoke a certificate and republish the CRL", body=REVOKE, response=tool_output("revoke_certificate"))
@api_view(["POST"])
def revoke_view(request):
    p = principal_of(request)
    rbac.check(p, "Security", "Delete", any_scope=True)
    d = payload(request, REVOKE)
    return ok(services.revoke_certificate(p, d["serial_hex"], d.get("reason", ""), cid=cid_of(request)))


@contract("POST", "Issue a code-signing certificate for a CSR", body=ISSUE,
          response=tool_output("issue_code_signing_cert"), status=201)
@api_view(["POST"])
def issue_view(request):
    p = principal_of(request)
    rbac.check(p, "Security", "Write", any_scope=True)
    d = payload(request, ISSUE)
    plan = services.plan_issue_code_signing_cert(p, d["csr_pem"], d["signer_name"], d["justification"],
                                                 d.get("validity_days", 365))
    return ok(services.issue_code_signing_cert(p, cid=cid_of(request), plan=plan), status=201)
