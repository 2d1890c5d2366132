"""Fetching client ID metadata documents: django-oauth-toolkit's SSRF-hardened fetch (https only; the host is
resolved once, every address checked, and the connection made to a checked address with SNI and certificate checks
for the name; no redirects; one deadline for the whole fetch; a size cap; failures backed off and the document cached
on the client) with yuzu's address policy and an audit row for every refusal.

Address policy: public addresses only, plus the networks an operator lists in YUZU_OAUTH_CIMD_ALLOWED_NETWORKS
(e.g. an internal client's 10.0.0.0/8). Cloud metadata endpoints are refused even then."""

import ipaddress
import socket
import ssl
import time

import urllib3
from django.conf import settings
from oauth2_provider import cimd as dot
from oauth2_provider.settings import oauth2_settings

from yuzu.audit import audit

METADATA_ADDRESSES = {ipaddress.ip_address(a) for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254",
                                                          "100.100.100.200")}


def allowed_networks():
    return [ipaddress.ip_network(n.strip(), strict=False)
            for n in settings.YUZU_OAUTH_CIMD_ALLOWED_NETWORKS.split(",") if n.strip()]


def address_allowed(ip):
    """Public (DOT's check, which also decodes IPv4 hidden in IPv6 forms), or in an operator-allowed network;
    never a cloud metadata address."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    embedded = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
    if addr in METADATA_ADDRESSES or embedded in METADATA_ADDRESSES:
        return False
    return dot._ip_is_public(ip) or any((embedded or addr) in net for net in allowed_networks())


def resolve(hostname, port):
    """Every address the name resolves to must be allowed (a mixed answer is refused whole)."""
    try:
        infos = socket.getaddrinfo(hostname, port, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise dot.CIMDError(f"could not resolve the client_id host: {exc}") from exc
    ips = [info[4][0] for info in infos]
    refused = [ip for ip in ips if not address_allowed(ip)]
    if refused or not ips:
        raise dot.CIMDError(f"the client_id host resolves to a private, loopback, link-local or metadata address "
                            f"({', '.join(refused) or 'none'}); an operator may allow its network with "
                            "YUZU_OAUTH_CIMD_ALLOWED_NETWORKS")
    return ips


class Fetcher(dot.SafeMetadataFetcher):
    def fetch(self, client_id):
        try:
            return self._fetch(client_id)
        except dot.CIMDError as exc:
            audit("anonymous", "oauth.client_metadata", "failure", target_type="OAuthClient",
                  target_id=client_id[:256], detail=str(exc)[:500])
            raise

    def _fetch(self, client_id):
        """DOT's SafeMetadataFetcher.fetch with ``resolve`` above for its address check."""
        parsed = dot._validate_client_id_url(client_id)
        port = parsed.port or 443
        ips = resolve(parsed.hostname, port)
        timeout = oauth2_settings.CIMD_FETCH_TIMEOUT_SECONDS
        path = parsed.path + (f"?{parsed.query}" if parsed.query else "")
        headers = {"Host": parsed.netloc, "Accept": "application/json, application/*+json"}
        ssl_context = ssl.create_default_context()
        deadline = time.monotonic() + timeout
        last_exc = None
        for ip in ips:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            pool = urllib3.HTTPSConnectionPool(
                host=ip, port=port, retries=False, maxsize=1, ssl_context=ssl_context, server_hostname=parsed.hostname,
                timeout=urllib3.Timeout(connect=remaining, read=remaining, total=remaining))
            try:
                response = pool.urlopen("GET", path, headers=headers, redirect=False, preload_content=False)
                try:
                    return self._read_document(response)
                finally:
                    response.release_conn()
            except urllib3.exceptions.HTTPError as exc:
                last_exc = exc
            finally:
                pool.close()
        raise dot.CIMDError(f"could not fetch the client_id document in {timeout} s: {last_exc}")
