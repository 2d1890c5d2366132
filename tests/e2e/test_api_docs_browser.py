"""The REST API documents itself offline: /api/v1/docs renders the Swagger UI reference in a real browser from the
project's own pinned static files, and the page asks nothing of any other host (no CDN, no web fonts).

With YUZU_DOCS_SCREENSHOTS=1 the rendered page is also written to docs/img/api-reference.png."""

import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.browser import chromium, open_page, require_browser

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def test_the_api_reference_renders_offline(daphne, tmp_path):
    require_browser()  # fails before any set-up when chromium is missing
    server = daphne()
    elsewhere = []

    def only_this_server(route):
        if urlsplit(route.request.url).netloc == f"127.0.0.1:{server.port}":
            route.continue_()
        else:  # the machine is offline as far as this page is concerned
            elsewhere.append(route.request.url)
            route.abort()

    with chromium() as browser:
        page = open_page(browser, None, {"width": 1280, "height": 900}, timeout=20000)
        page.route("**/*", only_this_server)
        page.goto(f"{server.base}/api/v1/docs")
        page.wait_for_selector("text=yuzu API")
        page.locator("text=Dispatch plugin.action to agents (async)").first.wait_for(state="attached")
        assert page.locator("button.authorize").count() == 1  # the bearer scheme: "Authorize" takes a token
        page.screenshot(path=str(tmp_path / "api-reference.png"))
        if os.environ.get("YUZU_DOCS_SCREENSHOTS") == "1":
            DOCS_IMG.mkdir(exist_ok=True)
            page.screenshot(path=str(DOCS_IMG / "api-reference.png"))
    assert elsewhere == []
