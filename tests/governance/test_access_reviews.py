"""Access reviews (spec/governance.md §2): a campaign freezes the grant population, attestations overwrite and
never touch the grant, closing applies the flagged revocations (audited), and the export verifies."""

import csv
import hashlib
import io
import json

import pytest
from django.test import Client

from governance import reviews
from yuzu.models import AuditEvent, RoleAssignment
from yuzu.rbac import Principal

pytestmark = pytest.mark.django_db


def canonical_sha256(rows):
    return hashlib.sha256(json.dumps(rows, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                          .encode()).hexdigest()


def test_open_attest_close_export(make_user):
    root = Principal(user=make_user("root", "Administrator"))
    make_user("vic", "Viewer")
    make_user("=cmd", "Operator")  # a name a spreadsheet would run
    opened = reviews.open_access_review(root, "Q4 review")
    assert opened["grant_count"] == 3
    cid = opened["campaign_id"]
    got = reviews.get_access_review(root, cid)
    assert got["pending_count"] == 3 and {a["principal_id"] for a in got["attestations"]} == {"root", "vic", "=cmd"}
    reviews.record_attestation(root, cid, "user", "vic", "Viewer", "attested")
    reviews.record_attestation(root, cid, "user", "vic", "Viewer", "flagged_revoke", "left the team")  # overwrites
    assert RoleAssignment.objects.filter(user__username="vic").exists()  # attesting never touches the grant
    make_user("late", "Viewer")  # out of scope of the frozen population
    with pytest.raises(Exception, match="grant not in campaign"):
        reviews.record_attestation(root, cid, "user", "late", "Viewer", "attested")
    assert reviews.close_access_review(root, cid) == {"closed": True, "revocations_applied": 1}
    assert not RoleAssignment.objects.filter(user__username="vic").exists()
    assert RoleAssignment.objects.filter(user__username="late").exists()
    with pytest.raises(Exception, match="campaign is closed"):
        reviews.record_attestation(root, cid, "user", "root", "Administrator", "attested")
    with pytest.raises(Exception, match="campaign is closed"):
        reviews.close_access_review(root, cid)
    doc = reviews.export_access_review(root, cid)
    assert doc["sha256"] == canonical_sha256(doc["rows"]) and doc["campaign"]["status"] == "closed"
    assert {r["principal_id"]: r["decision"] for r in doc["rows"]}["vic"] == "flagged_revoke"
    live = reviews.export_access_review(root)
    assert live["sha256"] == canonical_sha256(live["rows"])
    assert "vic" not in {r["principal_id"] for r in live["rows"]}
    assert AuditEvent.objects.filter(action="role_assignment.revoke").count() == 1
    assert {"access_review.campaign_opened", "access_review.flagged", "access_review.attested",
            "access_review.closed", "access_review.exported"} <= set(AuditEvent.objects.values_list("action", flat=True))
    listed = reviews.list_access_reviews(root)
    assert listed["count"] == 1


def test_rest_export_csv_is_injection_safe_and_verifiable(mint, make_user):
    raw = mint("root", role="Administrator")
    make_user("=cmd", "Operator")
    c = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    r = c.get("/api/v1/access-reviews/export?format=csv")
    assert r.status_code == 200 and r["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(r.content.decode())))
    assert rows[0][1] == "principal_id" and ["'=cmd"] == [row[1] for row in rows[1:-1] if "cmd" in row[1]]
    js = c.get("/api/v1/access-reviews/export").json()["data"]
    assert rows[-1] == [f"# sha256={js['sha256']}"] == [f"# sha256={r['X-Content-SHA256']}"]
    assert c.get("/api/v1/access-reviews/export?format=xml").status_code == 400
    r = c.post("/api/v1/access-reviews", {"title": "rest"}, content_type="application/json")
    assert r.status_code == 201
    cid = r.json()["data"]["campaign_id"]
    assert c.post("/api/v1/access-reviews", {"title": ""}, content_type="application/json").status_code == 400
    r = c.post(f"/api/v1/access-reviews/{cid}/attestations", {"principal_type": "user", "principal_id": "=cmd",
                                                               "role_name": "Operator", "decision": "attested"},
               content_type="application/json")
    assert r.status_code == 200, r.content
    assert c.post(f"/api/v1/access-reviews/{cid}/attestations", {"principal_type": "user", "principal_id": "x",
                                                                  "role_name": "Operator", "decision": "maybe"},
                  content_type="application/json").status_code == 400
    assert c.get(f"/api/v1/access-reviews/{cid}").json()["data"]["pending_count"] == 1
    assert c.get("/api/v1/access-reviews/not-a-uuid").status_code == 404
    assert c.post(f"/api/v1/access-reviews/{cid}/close", {}, content_type="application/json").status_code == 200
    assert c.get("/api/v1/access-reviews").json()["data"]["count"] == 1


def test_reviewer_role_and_engine_callers(make_user, mint):
    reviewer = Principal(user=make_user("rita", "Reviewer"))
    assert reviews.open_access_review(reviewer, "by a reviewer")["grant_count"] == 1
    viewer = Principal(user=make_user("vic", "Viewer"))
    with pytest.raises(Exception, match="AccessReview:Attest"):
        reviews.open_access_review(viewer, "no")
    assert reviews.list_access_reviews(viewer)["count"] == 1  # Viewer reads every securable


@pytest.mark.django_db(transaction=True)  # the MCP calls run in the server's own thread and connection
def test_a_supervised_token_cannot_revoke_grants_by_closing_a_review(mint, make_user):
    """Removing a grant is UserManagement:Write, approval-gated on the supervised tier; a Reviewer's supervised
    MCP token flagged an Administrator's grant and closed the campaign, and the grant was gone with no human.
    Now that close is refused before anything changes; a close with nothing flagged, and a person's, still work."""
    from tests.support.mcp_http import McpClient

    make_user("root-admin", "Administrator")
    bot = McpClient(mint("reviewer-bot", role="Reviewer", tier="supervised"))
    bot.initialize()

    def call(name, args):
        body = bot.call(name, args).json()
        return body.get("error") or body["result"]["structuredContent"]

    campaign = call("open_access_review", {"title": "q4"})["campaign_id"]
    assert call("record_attestation", {"campaign_id": campaign, "principal_type": "user", "principal_id": "root-admin",
                                       "role_name": "Administrator", "decision": "flagged_revoke"}) == {"recorded": True}
    refused = call("close_access_review", {"campaign_id": campaign})
    assert refused["code"] == -32003 and "needs a human approval" in refused["message"], refused
    assert RoleAssignment.objects.filter(user__username="root-admin").exists()
    assert reviews.get_access_review(Principal(user=RoleAssignment.objects.get(user__username="root-admin").user),
                                     campaign)["campaign"]["status"] == "open"
    call("record_attestation", {"campaign_id": campaign, "principal_type": "user", "principal_id": "root-admin",
                                "role_name": "Administrator", "decision": "attested"})
    assert call("close_access_review", {"campaign_id": campaign}) == {"closed": True, "revocations_applied": 0}
    assert RoleAssignment.objects.filter(user__username="root-admin").exists()


def test_the_csv_export_refuses_with_the_apis_json_error(mint):
    """``?format=csv`` served its errors (JSON error documents) as ``text/csv``: a client that trusts the
    Content-Type saved an error as the evidence file, or could not read why it was refused. Now an error is the
    API's JSON error, the same as without ``?format=csv``; the export itself is CSV. The OpenAPI document says so."""
    from yuzu.api.openapi import document

    c = Client(HTTP_AUTHORIZATION=f"Bearer {mint('root', role='Administrator')}")
    missing = "/api/v1/access-reviews/export?campaign_id=00000000-0000-0000-0000-000000000000"
    for client, path, status in [(c, missing, 404), (c, "/api/v1/access-reviews/export?campaign_id=x", 404),
                                 (Client(), "/api/v1/access-reviews/export", 401),
                                 (Client(HTTP_AUTHORIZATION="Bearer yuzu_nope"), "/api/v1/access-reviews/export", 401)]:
        as_json = client.get(path)
        as_csv = client.get(path + ("&" if "?" in path else "?") + "format=csv")
        assert as_json.status_code == as_csv.status_code == status, (path, as_csv.content)
        assert as_csv["Content-Type"] == as_json["Content-Type"] == "application/json", path
        body = as_csv.json()
        assert body["error"]["code"] == status and body["error"]["message"] == as_json.json()["error"]["message"]
        assert "Content-Disposition" not in as_csv
    r = c.get("/api/v1/access-reviews/export?format=csv")
    assert r.status_code == 200 and r["Content-Type"] == "text/csv; charset=utf-8"
    assert r.content.startswith(b"principal_type,principal_id,")
    responses = document()["paths"]["/api/v1/access-reviews/export"]["get"]["responses"]
    assert set(responses["200"]["content"]) == {"application/json", "text/csv"}
    assert all(set(responses[code]["content"]) == {"application/json"} for code in responses if code != "200")
