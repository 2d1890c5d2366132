"""An access review in a real browser (Debian's chromium via Playwright, against a real daphne) — issue 20, Must
show: a campaign is opened, a Reviewer signs in, keeps one grant and revokes another with the Keep / Revoke
buttons, closes the review, the revoked grant is gone, and the export of the campaign verifies (its sha256 is
the SHA-256 of its rows' canonical JSON).

With YUZU_DOCS_SCREENSHOTS=1 the review page is also written to docs/img/access-review.png."""

import hashlib
import json
import os

import pytest

from governance import reviews
from tests.support.browser import (
    admin_login,
    chromium,
    off_thread,
    open_page,
    require_browser,
    staff_with_authenticator,
)
from yuzu.models import AuditEvent, RoleAssignment
from yuzu.rbac import Principal, seed_builtin_roles
from yuzu.testing import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

PASSWORD = "reviewer-password-1"
VIEWPORT = {"width": 1200, "height": 800}


def test_a_reviewer_keeps_one_grant_revokes_another_and_closes(daphne, make_user, tmp_path):
    require_browser()  # fails before any set-up when chromium is missing
    seed_builtin_roles()
    device = staff_with_authenticator(make_user, "rita", "Reviewer", PASSWORD)
    rita = device.user
    make_user("olga", "Operator")
    make_user("vic", "Viewer")
    campaign = reviews.open_access_review(Principal(user=rita), "Q4 2026 access review")["campaign_id"]
    server = daphne()
    url = f"/admin/governance/accessreviewcampaign/{campaign}/review/"

    with chromium() as browser:
        page = open_page(browser, server.base, VIEWPORT)
        admin_login(page, server.base, url, "rita", PASSWORD, device)
        assert page.inner_text("#pending-count") == "3"

        page.click("tr[data-principal='olga'] button.keep")
        page.wait_for_selector("tr[data-principal='olga'] td.d-attested")
        page.click("tr[data-principal='vic'] button.revoke")
        page.wait_for_selector("tr[data-principal='vic'] td.d-flagged_revoke")
        assert page.inner_text("#pending-count") == "1"
        assert off_thread(lambda: RoleAssignment.objects.filter(user__username="vic").exists())  # not yet
        page.screenshot(path=str(tmp_path / "access-review.png"), full_page=True)
        if os.environ.get("YUZU_DOCS_SCREENSHOTS") == "1":
            page.screenshot(path=str(ROOT / "docs" / "img" / "access-review.png"), full_page=True)

        page.click("#close-review")
        page.wait_for_selector("text=Review closed; 1 grant(s) revoked.")
        assert "closed" in page.inner_text("#campaign-status")
        assert page.locator("button.keep").count() == 0  # a closed review takes no more decisions

    def after():
        gone = not RoleAssignment.objects.filter(user__username="vic").exists()
        kept = RoleAssignment.objects.filter(user__username="olga").exists()
        doc = reviews.export_access_review(Principal(user=rita), campaign)
        audited = list(AuditEvent.objects.filter(action__startswith="access_review.").values_list("action", flat=True))
        return gone, kept, doc, audited

    gone, kept, doc, audited = off_thread(after)
    assert gone and kept
    canonical = json.dumps(doc["rows"], sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert doc["sha256"] == hashlib.sha256(canonical).hexdigest()
    decisions = {r["principal_id"]: (r["decision"], r["revoked_on_close"]) for r in doc["rows"]}
    assert decisions == {"olga": ("attested", False), "vic": ("flagged_revoke", True), "rita": ("pending", False)}
    assert {"access_review.attested", "access_review.flagged", "access_review.closed"} <= set(audited)
