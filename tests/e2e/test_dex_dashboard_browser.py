"""The DEX dashboard in a real browser (Debian's chromium via Playwright, against a real daphne): a PlatformEngineer
(GuaranteedState:Read) signs in and sees the fleet perf and network now-views, the worst devices first, the
signals of the last 24 h and who sends no perf; a device that did not report a metric is not shown as 0.

With YUZU_DOCS_SCREENSHOTS=1 the page is also written to docs/img/dex-dashboard.png."""

import os
from datetime import timedelta

import pytest

from fleet.models import Agent
from tests.dex.conftest import agent, observe
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

PASSWORD = "engineer-password-1"
VIEWPORT = {"width": 1280, "height": 1000}


def fleet():
    """Twelve reporting devices (one busy, one that reports no disk latency), one online that sends nothing."""
    for i in range(12):
        agent(f"a{i:02d}", cpu_pct=96.5 if i == 0 else 5.0 + i, commit_pct=30.0 + 2 * i,
              disk_lat_ms=None if i == 1 else 1.0 + i / 2, rtt_ms=8.0 + i, retrans_pct=0.1 * i,
              throughput_bps=1e5 * (i + 1))
    agent("silent")
    Agent.objects.filter(agent_id="a00").update(hostname="build-07")
    Agent.objects.filter(agent_id="silent").update(hostname="kiosk-02")
    observe(Agent.objects.get(pk="a00"), "perf.cpu_sustained", "cpu")
    observe(Agent.objects.get(pk="a03"), "storage.low", "/dev/sda1", ago=timedelta(hours=2))


def test_the_dex_dashboard(daphne, make_user, tmp_path):
    require_browser()  # fails before any set-up when chromium is missing
    device = staff_with_authenticator(make_user, "pat", "PlatformEngineer", PASSWORD)
    server = daphne()
    with chromium() as browser:
        page = open_page(browser, server.base, VIEWPORT)
        admin_login(page, server.base, "/admin/dex/devicefacts/", "pat", PASSWORD, device)
        assert "nobody reported" in page.inner_text("#dex-perf")  # an empty fleet: no zeros
        off_thread(fleet)
        page.reload()
        assert page.inner_text("#dex-perf-reporting") == "12"
        assert page.inner_text("#dex-under-pressure") == "1"
        cpu_row = page.inner_text("#dex-perf tbody tr:first-child")
        assert "96.5" in cpu_row and "12" in cpu_row
        disk_n = page.inner_text("#dex-perf tbody tr:nth-child(3) td:last-child")
        assert disk_n == "11"  # a01 reported no disk latency: not counted as 0
        worst_cpu = page.locator("#dex-worst-1 tbody tr").first
        assert "build-07" in worst_cpu.inner_text() and "100" in worst_cpu.inner_text()
        signals = page.inner_text("#dex-signals")
        assert "perf.cpu_sustained" in signals and "storage.low" in signals and "kiosk-02" in signals
        page.screenshot(path=str(tmp_path / "dex-dashboard.png"), full_page=True)
        if os.environ.get("YUZU_DOCS_SCREENSHOTS") == "1":
            page.screenshot(path=str(ROOT / "docs" / "img" / "dex-dashboard.png"), full_page=True)
    assert off_thread(lambda: AuditEvent.objects.filter(action="dex.dashboard.view", principal="pat").count()) == 2
