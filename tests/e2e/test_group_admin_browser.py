"""The management-group page in a real browser (Debian's chromium via Playwright, against a real daphne): the
superuser puts a group under its own grandchild; the page says why it cannot, on the form, and nothing changes."""

import pytest

from fleet.models import ManagementGroup
from tests.support.browser import (
    admin_login,
    chromium,
    off_thread,
    open_page,
    require_browser,
    staff_with_authenticator,
)
from yuzu.models import AuditEvent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

PASSWORD = "root-password-1"


def test_a_group_under_its_own_grandchild_is_refused_on_the_page(daphne, make_user):
    require_browser()  # fails before any set-up when chromium is missing
    device = staff_with_authenticator(make_user, "root", None, PASSWORD, superuser=True)
    top = ManagementGroup.objects.create(name="top")
    mid = ManagementGroup.objects.create(name="mid", parent=top)
    ManagementGroup.objects.create(name="leaf", parent=mid)
    server = daphne()

    with chromium() as browser:
        page = open_page(browser, server.base, {"width": 1100, "height": 800})
        url = f"/admin/fleet/managementgroup/{top.pk}/change/"
        admin_login(page, server.base, url, "root", PASSWORD, device)
        page.select_option("#id_parent", label="leaf")
        page.click("input[name=_save]")
        page.wait_for_selector(".errorlist")
        assert page.url == f"{server.base}{url}"
        assert "a group cannot be its own ancestor" in page.inner_text(".field-parent .errorlist")
        assert page.input_value("#id_parent") == off_thread(lambda: ManagementGroup.objects.get(name="leaf").pk)

    top.refresh_from_db()
    assert top.parent_id is None
    assert not AuditEvent.objects.filter(action__startswith="management_group.").exists()
