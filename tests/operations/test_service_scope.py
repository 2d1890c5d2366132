"""A service-scoped token reads the software and licences of its service's devices only (docs/tokens-and-rbac.md:
"scope_service confines the token to one service's devices"). Both tools are of the "confined" class: the
pipeline lets the token through, so the service functions must do the confining."""

import pytest

from fleet.models import Agent, Tag
from operations import inventory
from operations.models import DetectedLicense, InstalledSoftware
from tests.operations.conftest import Caller

pytestmark = pytest.mark.django_db
HASH = "b" * 64


def pkg(name, version):
    return {"name": name, "version": version, "publisher": "", "install_date": "", "source": "dpkg"}


LICENCE = {"product": "rhel", "vendor": "Red Hat", "version": "9", "license_type": "subscription",
           "state": "subscription_active", "channel": "entitlement", "expiry_at": 1893456000,
           "detector": "entitlement_cert", "confidence": "authoritative", "key_hint": "ab12", "exe_hints": []}


@pytest.fixture
def fleet(agent):
    """a1 is tagged service=payments; b2 belongs to another service."""
    Agent.objects.create(agent_id="b2", hostname="b2", os="linux", connected=True)
    Tag.objects.create(agent=agent, key="service", value="payments")
    Tag.objects.create(agent_id="b2", key="service", value="hr")
    for aid in ("a1", "b2"):
        inventory.receive_software(aid, {"hash": HASH, "page": 0, "pages": 1, "packages": [pkg("openssl", "3.0.2")]})
        inventory.receive_licenses(aid, {"licenses": [LICENCE]})


@pytest.fixture
def payments(mint):
    return Caller(mint("svc", role="Viewer", tier="readonly", scope_service="payments"))


def test_a_service_scoped_token_finds_software_only_on_its_service_devices(fleet, payments):
    out, error = payments.tool("query_installed_software", {"name": "openssl"})
    assert error is None
    assert [r["agent_id"] for r in out["software"]] == ["a1"]
    assert out["devices_omitted"] == 1
    out, _ = payments.tool("query_installed_software", {"agent_id": "b2"})
    assert out["software"] == [] and out["count"] == 0
    out, _ = payments.tool("query_installed_software", {"name": "openssl", "counts": True})
    assert out["versions"] == [{"name": "openssl", "version": "3.0.2", "devices": 1}]


def test_a_service_scoped_token_reads_another_services_device_licences_as_an_unknown_device(fleet, payments):
    out, _ = payments.tool("query_software_licenses", {"agent_id": "a1"})
    assert out["count"] == 1
    other, error = payments.tool("query_software_licenses", {"agent_id": "b2"})
    missing, _ = payments.tool("query_software_licenses", {"agent_id": "zz"})
    assert error is None
    assert other == {"agent_id": "b2", "count": 0, "licenses": []}
    assert missing == {"agent_id": "zz", "count": 0, "licenses": []}


def test_an_unscoped_token_still_reads_every_device(fleet, mint):
    c = Caller(mint("all", role="Viewer", tier="readonly"))
    out, _ = c.tool("query_installed_software", {"name": "openssl"})
    assert [r["agent_id"] for r in out["software"]] == ["a1", "b2"] and "devices_omitted" not in out
    assert c.tool("query_software_licenses", {"agent_id": "b2"})[0]["count"] == 1


def test_a_service_scoped_token_cannot_erase_another_services_device_inventory(fleet, mint, client):
    """DELETE /api/v1/sle/agents/{id} erased any device's software, licence and sync rows for a token scoped to
    another service. Another service's device now answers as an unknown device does (docs/operator.md:
    erased_rows 0), and nothing of it is erased; an unknown device answers a service-scoped token as it answers
    any caller holding the permissions fleet-wide — it was refused (403 "permission denied: SoftwareLicensing:Delete"
    to an Administrator)."""
    raw = mint("svc-admin", role="Administrator", scope_service="payments")
    other = client.delete("/api/v1/sle/agents/b2", HTTP_AUTHORIZATION=f"Bearer {raw}")
    missing = client.delete("/api/v1/sle/agents/zz", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert other.status_code == missing.status_code == 200, (other.content, missing.content)
    assert other.json()["data"] == {"agent_id": "b2", "erased_rows": 0}
    assert missing.json()["data"] == {"agent_id": "zz", "erased_rows": 0}
    assert InstalledSoftware.objects.filter(agent_id="b2").exists()
    assert DetectedLicense.objects.filter(agent_id="b2").exists()
    own = client.delete("/api/v1/sle/agents/a1", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert own.json()["data"]["erased_rows"] > 0 and not InstalledSoftware.objects.filter(agent_id="a1").exists()


@pytest.mark.parametrize(("method", "path", "body"), [
    ("get", "/api/v1/plugin-config", None),
    ("get", "/api/v1/plugin-config/process/default_limit", None),
    ("put", "/api/v1/plugin-config/process/default_limit", {"value": "5"}),
    ("put", "/api/v1/plugin-config/process/api.token/secret", {"value": "s3cret"}),
    ("get", "/api/v1/plugin-config/os/kill-switch", None),
    ("put", "/api/v1/plugin-config/os/kill-switch", {"enabled": False}),
    ("put", "/api/v1/plugin-config/os/kill-switch?group=g", {"enabled": False}),
    ("get", "/api/v1/upload-grants", None),
    ("post", "/api/v1/upload-grants", {"agent_id": "b2", "declared_max_size": 10}),
    ("delete", "/api/v1/upload-grants/abcdef", None),
])
def test_the_rest_twins_of_tools_closed_to_service_scopes_refuse_them_too(fleet, mint, client, method, path, body):
    """Over MCP these tools refuse a service-scoped token outright (their class is "denied": they reach beyond one
    service's devices). Their REST twins let it through: a token scoped to service=payments minted an upload
    grant for hr's device, rewrote fleet-wide plugin configuration and flipped kill switches."""
    from fleet.models import ManagementGroup
    from operations.models import PluginConfig, PluginKillSwitch, PluginSecret, UploadGrant

    ManagementGroup.objects.create(name="g")
    raw = mint("svc-admin", role="Administrator", scope_service="payments")
    kw = {"content_type": "application/json"} if body is not None else {}
    r = getattr(client, method)(path, *([body] if body is not None else []), HTTP_AUTHORIZATION=f"Bearer {raw}",
                                **kw)
    assert r.status_code == 403, r.content
    assert "service-scoped" in r.json()["error"]["message"]
    assert not (PluginConfig.objects.exists() or PluginSecret.objects.exists() or PluginKillSwitch.objects.exists()
                or UploadGrant.objects.exists())
