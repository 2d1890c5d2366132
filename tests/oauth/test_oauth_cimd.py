"""Client ID metadata documents (the 2026 MCP profile's preferred registration): a client whose client_id is an
https URL is registered by fetching that document — with limits on size, time and redirects, a cache, and an
address policy that refuses private, loopback, link-local and cloud metadata addresses unless an operator allows a
network (YUZU_OAUTH_CIMD_ALLOWED_NETWORKS). Every refusal is an error page (never a redirect), creates no client,
issues nothing, and leaves an audit row saying why. A local HTTPS server (tests/support/metadata_server.py) publishes the
documents."""

import socket

import pytest
from django.conf import settings
from django.test import override_settings
from oauth2_provider import cimd as dot
from oauth2_provider.models import Application

from oauth.cimd import address_allowed, resolve
from tests.support.metadata_server import MetadataServer
from tests.support.oauth_flow import REDIRECT, Flow, signed_in, token_request
from yuzu.models import AuditEvent

pytestmark = pytest.mark.django_db(transaction=True)

GOOD = {"client_name": "Claude (metadata document)", "redirect_uris": [REDIRECT],
        "grant_types": ["authorization_code", "refresh_token"], "token_endpoint_auth_method": "none"}
LOOPBACK = override_settings(YUZU_OAUTH_CIMD_ALLOWED_NETWORKS="127.0.0.0/8")


def fetch_timeout(seconds):
    return override_settings(OAUTH2_PROVIDER={**settings.OAUTH2_PROVIDER, "CIMD_FETCH_TIMEOUT_SECONDS": seconds})


@pytest.fixture(autouse=True)
def fresh_cache():
    from django.core.cache import cache

    cache.clear()  # the failure backoff and the registration limits
    yield
    cache.clear()


@pytest.fixture
def documents(tmp_path, monkeypatch):
    server = MetadataServer(tmp_path, {
        "good": GOOD,
        "mismatch": {**GOOD, "client_id": "https://elsewhere.example.com/client.json"},
        "secret": {**GOOD, "client_secret": "s3cret"},
        "implicit": {**GOOD, "grant_types": ["implicit"]},
        "insecure": {**GOOD, "redirect_uris": ["http://client.example.com/cb"]},
        "notjson": "<html>hello</html>",
    }, slow_seconds=3, names=("localhost", "client.example.test"))
    monkeypatch.setenv("SSL_CERT_FILE", server.ca_file)  # trust the test CA (OpenSSL reads it per context)
    yield server
    server.close()


@pytest.fixture
def browser(make_user):
    user = make_user("alice", "Operator")
    user.is_staff = True
    user.save()
    return signed_in(user)


def refused(browser, url, reason):
    """The authorization request with this client_id is an error page; no client exists; the audit says why."""
    page = Flow(url).consent(browser)
    assert page.status_code == 400 and "Location" not in page, page.content[:300]
    assert "Invalid client_id parameter value" in page.content.decode()
    assert not Application.objects.filter(client_id=url).exists()
    rows = AuditEvent.objects.filter(action="oauth.client_metadata", result="failure", target_id=url)
    assert rows.exists() and reason in rows.last().detail, [r.detail for r in rows]


@LOOPBACK
def test_a_metadata_document_registers_the_client_and_the_flow_completes(documents, browser):
    url = documents.url("good.json")
    flow = Flow(url)
    page = flow.consent(browser)
    assert page.status_code == 200, page.content[:500]
    html = page.content.decode()
    assert "Claude (metadata document)" in html and f"metadata document at 127.0.0.1:{documents.port}" in html
    app = Application.objects.get(client_id=url)
    assert (app.registration_source, app.client_type, app.redirect_uris) == ("cimd", "public", REDIRECT)
    assert AuditEvent.objects.filter(action="oauth.client.register", result="success", target_id=url).exists()
    r = flow.exchange(flow.approve(browser, tier="readonly"))
    assert r.status_code == 200 and r.json()["scope"] == "mcp:readonly"
    # The document is cached on the client: the next authorization does not fetch it again.
    assert Flow(url).consent(browser).status_code == 200
    assert documents.hits["/good.json"] == 1


@LOOPBACK
def test_the_name_is_resolved_once_and_the_checked_address_is_what_is_connected_to(documents, browser, monkeypatch):
    """client.example.test resolves (here) to 127.0.0.1, which the operator allowed; the certificate is checked for
    the name while the connection goes to the address that was checked."""
    real = socket.getaddrinfo
    lookups = []

    def fake(host, *args, **kw):
        if host == "client.example.test":
            lookups.append(host)
            return real("127.0.0.1", *args, **kw)
        return real(host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    url = documents.url("good.json", host="client.example.test")
    assert Flow(url).consent(browser).status_code == 200
    assert lookups == ["client.example.test"] and documents.hits["/good.json"] == 1


def test_a_private_address_is_refused_before_any_connection(documents, browser):
    refused(browser, documents.url("good.json"), "private, loopback, link-local or metadata address (127.0.0.1)")
    refused(browser, documents.url("good.json", host="localhost"), "private, loopback")
    # At the token endpoint the same client is simply unknown.
    r = token_request({"grant_type": "authorization_code", "code": "x", "redirect_uri": REDIRECT,
                       "client_id": documents.url("other.json"), "code_verifier": "v" * 43})
    assert r.status_code == 401 and r.json()["error"] == "invalid_client"
    assert sum(documents.hits.values()) == 0  # never connected


@LOOPBACK
def test_a_document_over_the_size_limit_is_refused(documents, browser):
    refused(browser, documents.url("big.json"), "exceeds the maximum allowed size")


@LOOPBACK
def test_a_slow_document_is_refused_at_the_deadline(documents, browser):
    with fetch_timeout(1):
        refused(browser, documents.url("slow.json"), "could not fetch the client_id document in 1 s")


@LOOPBACK
def test_a_redirect_is_not_followed(documents, browser):
    refused(browser, documents.url("redirect.json"), "HTTP 302")
    assert documents.hits["/good.json"] == 0


@LOOPBACK
@pytest.mark.parametrize("name", ["mismatch", "secret", "implicit", "notjson", "missing"])
def test_documents_that_are_not_valid_client_metadata_register_nothing(documents, browser, name):
    url = documents.url(f"{name}.json")
    page = Flow(url).consent(browser)
    assert page.status_code == 400 and "Location" not in page
    assert not Application.objects.filter(client_id=url).exists()


@LOOPBACK
def test_an_http_redirect_uri_to_another_host_is_refused_at_authorization(documents, browser):
    url = documents.url("insecure.json")
    page = Flow(url, redirect="http://client.example.com/cb").consent(browser)
    assert page.status_code == 400 and "Location" not in page
    assert "https, or http only to a loopback address" in page.content.decode()


@LOOPBACK
def test_failures_are_backed_off_and_first_sights_are_rate_limited(documents, browser):
    url = documents.url("redirect.json")
    Flow(url).consent(browser)
    Flow(url).consent(browser)
    assert documents.hits["/redirect.json"] == 1  # the second attempt within the backoff did not fetch
    with override_settings(YUZU_OAUTH_REGISTRATIONS_PER_HOUR=0):
        page = Flow(documents.url("good.json")).consent(browser)
    assert page.status_code == 400 and documents.hits["/good.json"] == 0
    assert "reason=rate_limited" in AuditEvent.objects.filter(action="oauth.client.register", result="denied").last().detail


def test_the_address_policy(monkeypatch, settings):
    settings.YUZU_OAUTH_CIMD_ALLOWED_NETWORKS = ""
    for ip in ("127.0.0.1", "10.1.2.3", "192.168.0.1", "169.254.169.254", "::1", "fe80::1", "::ffff:10.0.0.1",
               "100.64.0.1", "0.0.0.0", "fd00:ec2::254"):
        assert not address_allowed(ip), ip
    assert address_allowed("93.184.215.14") and address_allowed("2606:2800:21f:cb07:6820:80da:af6b:8b2c")
    settings.YUZU_OAUTH_CIMD_ALLOWED_NETWORKS = "10.0.0.0/8, 169.254.0.0/16"
    assert address_allowed("10.1.2.3") and address_allowed("::ffff:10.1.2.3") and address_allowed("169.254.1.1")
    assert not address_allowed("169.254.169.254")  # cloud metadata: never, whatever is allowed
    assert not address_allowed("192.168.0.1")
    # A name whose answer mixes a public and a private address is refused whole.
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **kw: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 443)),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.168.0.1", 443))])
    with pytest.raises(dot.CIMDError, match="192.168.0.1"):
        resolve("mixed.example.com", 443)
