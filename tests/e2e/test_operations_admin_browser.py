"""The operator surface's admin pages in a real browser (Debian's chromium via Playwright, against a real
daphne): an Administrator signs in, sets a plugin configuration value (a value the plugin's schema refuses is
shown on the form and nothing is saved), stores a secret (a password field; the list shows no value), and
switches a plugin off with a reason.

With YUZU_DOCS_SCREENSHOTS=1 the kill-switch list is also written to docs/img/operations-kill-switches.png."""

import os

import pytest

from fleet.agent.plugins import catalogue
from fleet.models import Agent, AgentInventory, ManagementGroup
from operations.models import PluginConfig, PluginKillSwitch, PluginSecret
from tests.support.browser import (
    admin_login,
    chromium,
    off_thread,
    open_page,
    require_browser,
    staff_with_authenticator,
)
from yuzu.models import AuditEvent
from yuzu.testing import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

PASSWORD = "operator-password-1"
VIEWPORT = {"width": 1100, "height": 800}


def test_plugin_configuration_secret_and_kill_switch_in_the_admin(daphne, make_user, tmp_path):
    require_browser()  # fails before any set-up when chromium is missing
    device = staff_with_authenticator(make_user, "ada", "Administrator", PASSWORD)
    agent = Agent.objects.create(agent_id="b1", hostname="b1.example", os="linux")
    lab = ManagementGroup.objects.create(name="lab")
    AgentInventory.objects.create(agent=agent, plugin=AgentInventory.CATALOGUE, data=catalogue())
    server = daphne()

    with chromium() as browser:
        page = open_page(browser, server.base, VIEWPORT)
        admin_login(page, server.base, "/admin/operations/pluginconfig/add/", "ada", PASSWORD, device)

        page.fill("#id_plugin", "process")
        page.fill("#id_key", "default_limit")
        page.fill("#id_value", "many")
        page.click("input[name=_save]")
        assert "does not match the plugin's schema" in page.inner_text(".errorlist")
        assert off_thread(lambda: PluginConfig.objects.count()) == 0
        page.fill("#id_value", "25")
        page.click("input[name=_save]")
        page.wait_for_url(f"{server.base}/admin/operations/pluginconfig/")
        assert off_thread(lambda: PluginConfig.objects.get().value) == "25"

        page.goto("/admin/operations/pluginsecret/add/")
        assert page.get_attribute("#id_value", "type") == "password"
        page.fill("#id_plugin", "process")
        page.fill("#id_key", "api.token")
        page.fill("#id_value", "browser-secret-value")
        page.click("input[name=_save]")
        page.wait_for_url(f"{server.base}/admin/operations/pluginsecret/")
        assert "process.api.token" in page.inner_text("#result_list")
        page.click("text=process.api.token")
        assert "browser-secret-value" not in page.content()  # write-only: never shown again
        assert off_thread(lambda: PluginSecret.objects.filter(pk="process.api.token").exists())

        page.goto("/admin/operations/pluginkillswitch/add/")
        page.fill("#id_plugin", "script")
        page.uncheck("#id_enabled")
        page.fill("#id_reason", "incident 7: runaway scripts")
        page.click("input[name=_save]")
        page.wait_for_url(f"{server.base}/admin/operations/pluginkillswitch/")
        assert "incident 7" in page.inner_text("#result_list")
        page.goto("/admin/operations/pluginkillswitch/add/")  # one group's switch
        page.fill("#id_plugin", "process")
        page.select_option("#id_group", label="lab")
        page.uncheck("#id_enabled")
        page.fill("#id_reason", "lab maintenance")
        page.click("input[name=_save]")
        page.wait_for_url(f"{server.base}/admin/operations/pluginkillswitch/")
        assert "lab maintenance" in page.inner_text("#result_list")
        page.screenshot(path=str(tmp_path / "operations-kill-switches.png"), full_page=True)
        if os.environ.get("YUZU_DOCS_SCREENSHOTS") == "1":
            page.screenshot(path=str(ROOT / "docs" / "img" / "operations-kill-switches.png"), full_page=True)

    switch = PluginKillSwitch.objects.get(pk="script")
    assert (switch.enabled, switch.set_by) == (False, "ada")
    assert PluginKillSwitch.objects.get(pk=f"process@{lab.pk}").group == lab
    actions = set(AuditEvent.objects.filter(principal="ada").values_list("action", flat=True))
    assert {"plugin_config.set", "plugin_secret.set", "plugin_kill_switch.set"} <= actions
    assert not AuditEvent.objects.filter(detail__contains="browser-secret-value").exists()
