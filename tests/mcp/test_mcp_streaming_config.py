"""The streaming package's outside: its knobs are Django settings (not os.environ read at import), and the
metric families it exports carry the names docs/metrics.md lists — progress reporting is yuzu_mcp_progress_*,
nothing is named after the bridge app."""

import json
import re

import pytest
from asgiref.sync import async_to_sync
from django.test import Client, override_settings

from tests.support.mcp_http import McpClient
from tests.support.sse_client import Stream
from yuzu.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)


def scrape():
    return Client().get("/metrics").content.decode()


def test_progress_metric_families_are_renamed():
    text = scrape()
    families = set(re.findall(r"^# TYPE (\S+)", text, re.M))
    assert {"yuzu_mcp_progress_records_active", "yuzu_mcp_progress_suppressed_total",
            "yuzu_mcp_progress_pin_displaced_for_admission_total"} <= families
    assert not [f for f in families if f.startswith("yuzu_mcp_bridge")]


def test_stream_cap_gauge_follows_the_setting():
    with override_settings(YUZU_MCP_MAX_STREAMS=7):
        assert re.search(r"^yuzu_mcp_streams_cap 7\.0$", scrape(), re.M)


def get(client):
    headers = {"host": "127.0.0.1:8000", "accept": "text/event-stream", **client.headers()}
    return Stream(application, "GET", "/mcp/v1/", headers)


@override_settings(YUZU_MCP_MAX_STREAMS=1)
def test_the_process_stream_cap_is_the_setting(mint):
    first, second = (McpClient(mint(name, role="Viewer", tier="readonly")) for name in ("cap-a", "cap-b"))
    first.initialize()
    second.initialize()

    async def go():
        held = await get(first).open()
        assert held.status == 200
        refused = await get(second).open()
        await refused.read_body()
        err = json.loads(refused.buffer)["error"]
        assert refused.status == 429 and err["code"] == -32012 and "global_cap" in err["message"]
        assert refused.headers["retry-after"] == "5" and err["data"]["retry_after_ms"] == 5000
        await held.disconnect()
        again = await get(second).open()  # the slot came back with the disconnect
        assert again.status == 200
        await again.disconnect()
    async_to_sync(go)()


@pytest.mark.parametrize("raw, expected", [("", 1024), ("50", 50), ("0", 1), ("many", 1024)])
def test_max_streams_setting_parses_the_environment(monkeypatch, raw, expected):
    from yuzu import settings

    monkeypatch.setenv("YUZU_MCP_MAX_STREAMS", raw)
    assert settings._max_streams() == expected
