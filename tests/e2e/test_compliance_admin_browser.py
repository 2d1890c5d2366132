"""The compliance admin in a real browser (Debian's chromium via Playwright, against a real daphne): a
PlatformEngineer signs in, writes a policy as YAML (a CEL mistake is shown on the form, with its position, and
nothing is saved), saves it, and its page shows the fleet percentage of its verdicts.

With YUZU_DOCS_SCREENSHOTS=1 the policy page is also written to docs/img/compliance-policy.png."""

import os

import pytest
from django.utils import timezone

from compliance.models import Policy, PolicyAgentStatus, PolicyFragment
from tests.support.browser import (
    admin_login,
    chromium,
    off_thread,
    open_page,
    require_browser,
    staff_with_authenticator,
)
from tests.support.compliance import FRAGMENT, POLICY, agents
from yuzu.testing import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

PASSWORD = "engineer-password-1"
VIEWPORT = {"width": 1100, "height": 900}


def test_a_policy_written_in_the_admin_and_its_compliance_page(daphne, make_user, tmp_path):
    require_browser()  # fails before any set-up when chromium is missing
    device = staff_with_authenticator(make_user, "pat", "PlatformEngineer", PASSWORD)
    PolicyFragment().apply_yaml(FRAGMENT).save()
    server = daphne()

    with chromium() as browser:
        page = open_page(browser, server.base, VIEWPORT)
        admin_login(page, server.base, "/admin/compliance/policy/add/", "pat", PASSWORD, device)

        page.fill("#id_yaml_source", POLICY.replace("triggers:", "scope: 'ostype == '\n  triggers:"))
        page.click("input[name=_save]")
        assert "spec.scope is not a valid scope expression" in page.inner_text(".errorlist")
        assert off_thread(lambda: Policy.objects.count()) == 0

        page.fill("#id_yaml_source", POLICY)
        page.click("input[name=_save]")
        page.wait_for_url(f"{server.base}/admin/compliance/policy/")

        def verdicts():
            policy = Policy.objects.get()
            for agent, status in zip(agents("web-1", "web-2", "web-3", "web-4"),
                                     ("compliant", "compliant", "compliant", "non_compliant"), strict=True):
                PolicyAgentStatus.objects.create(policy=policy, agent=agent, status=status,
                                                 last_check_at=timezone.now())
            return policy.pk

        policy_id = off_thread(verdicts)
        page.goto(f"/admin/compliance/policy/{policy_id}/change/")
        text = page.inner_text(".field-compliance")
        assert "75.0 % compliant of 4 evaluated agent(s)" in text and "1 non-compliant" in text
        page.screenshot(path=str(tmp_path / "compliance-policy.png"), full_page=True)
        if os.environ.get("YUZU_DOCS_SCREENSHOTS") == "1":
            page.screenshot(path=str(ROOT / "docs" / "img" / "compliance-policy.png"), full_page=True)
        page.click("text=Verdicts per agent")
        page.wait_for_url(f"**/admin/compliance/policyagentstatus/?policy__id__exact={policy_id}")
        page.wait_for_selector("#result_list tbody tr")
        assert page.locator("#result_list tbody tr").count() == 4
