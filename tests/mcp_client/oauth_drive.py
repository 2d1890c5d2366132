"""Connect to yuzu through the official MCP Python SDK's OAuth support (`mcp` 2.3.0: ``OAuthClientProvider``) and
run a scenario of drive.py with the token it got; print what happened.

Run it with the SDK's own interpreter, never the project's (docs/mcp-conformance.md)::

    .venv-mcp/bin/python tests/mcp_client/oauth_drive.py --url http://127.0.0.1:8000/mcp/v1/ --dir /tmp/x \\
        --redirect-uri http://127.0.0.1:8765/callback [--client-metadata-url https://…/client.json] \\
        --scenario fleet_supervised --param agent_id=… --param approved=/tmp/x/approved

The browser side is the driving test's: for the N-th authorization the SDK asks for, this script writes the
authorization URL to ``DIR/authorize-N.url`` and waits (bounded) for the URL the browser was redirected to in
``DIR/callback-N.url``. Steps are drive.py's, plus ``{"op": "expire_token"}``, which makes the SDK treat its access
token as expired so the next request refreshes it first.

It prints ONE JSON document (exit 0), or the same with ``fatal`` (exit 2): the scenario's observations, ``http``
(every request: method, URL path, status, whether it carried a bearer token), ``tokens`` (each token response's
scope and a fingerprint of each token, never the token) and ``authorizations`` (how many browser round trips).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2

from mcp import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

warnings.simplefilter("ignore")

from drive import (  # noqa: E402  (this folder is on sys.path when run as a script)
    SCENARIOS,
    Driver,
    run_and_report,
)


def fingerprint(secret: str | None) -> str | None:
    return hashlib.sha256(secret.encode()).hexdigest()[:12] if secret else None


class Memory:
    """The SDK's TokenStorage, in memory; records what the token endpoint answered."""

    def __init__(self, obs: dict[str, Any]):
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None
        self.log = obs.setdefault("tokens", [])
        self.obs = obs

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens
        self.log.append({"scope": tokens.scope, "expires_in": tokens.expires_in,
                         "access": fingerprint(tokens.access_token), "refresh": fingerprint(tokens.refresh_token),
                         "access_prefix": tokens.access_token[:5]})

    async def get_client_info(self):
        return self.client

    async def set_client_info(self, info):
        self.client = info
        self.obs["client_id"] = info.client_id


class Browser:
    """The hand-off to the driving test's browser, through files."""

    def __init__(self, directory: Path, obs: dict[str, Any], timeout: float = 240):
        self.dir, self.obs, self.timeout, self.n = directory, obs, timeout, 0

    async def open(self, url: str) -> None:
        self.n += 1
        self.obs["authorizations"] = self.n
        tmp = self.dir / f"authorize-{self.n}.url.tmp"
        tmp.write_text(url)
        tmp.rename(self.dir / f"authorize-{self.n}.url")

    async def callback(self) -> AuthorizationCodeResult:
        path, deadline = self.dir / f"callback-{self.n}.url", time.monotonic() + self.timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no browser callback in {self.timeout} s")
            await asyncio.sleep(0.1)
        query = {k: v[0] for k, v in parse_qs(urlsplit(path.read_text()).query).items()}
        if "code" not in query:
            raise RuntimeError(f"authorization refused: {query.get('error')}: {query.get('error_description')}")
        return AuthorizationCodeResult(code=query["code"], state=query.get("state"), iss=query.get("iss"))


async def drive(a: argparse.Namespace, steps: list[dict[str, Any]], params: dict[str, str], obs: dict[str, Any]):
    http_log: list[dict[str, Any]] = obs.setdefault("http", [])

    async def on_response(response: httpx2.Response) -> None:
        request = response.request
        rpc = None
        if request.method == "POST" and request.url.path.startswith("/mcp/"):
            try:
                rpc = json.loads(request.content).get("method")
            except (ValueError, AttributeError, httpx2.RequestNotRead):
                rpc = None
        http_log.append({"method": request.method, "path": request.url.path, "rpc": rpc,
                         "status": response.status_code,
                         "bearer": request.headers.get("authorization", "").startswith("Bearer "),
                         "www_authenticate": response.headers.get("www-authenticate")})

    storage, browser = Memory(obs), Browser(Path(a.dir), obs)
    metadata = OAuthClientMetadata(client_name="yuzu e2e (official MCP SDK)", redirect_uris=[a.redirect_uri],
                                   grant_types=["authorization_code", "refresh_token"], response_types=["code"],
                                   token_endpoint_auth_method="none")
    provider = OAuthClientProvider(a.url, metadata, storage, redirect_handler=browser.open,
                                   callback_handler=browser.callback, client_metadata_url=a.client_metadata_url)

    class OAuthDriver(Driver):
        async def op_expire_token(self, step):
            provider.context.token_expiry_time = time.time() - 1

    async with httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(30.0, read=120.0),
                                  event_hooks={"response": [on_response]}) as http:
        async with Client(streamable_http_client(a.url, http_client=http), mode="legacy",
                          read_timeout_seconds=60) as client:
            obs["protocol_version"] = client.protocol_version
            await OAuthDriver(client, obs, params).run(steps)
        obs["closed"] = True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--redirect-uri", required=True)
    ap.add_argument("--client-metadata-url")
    ap.add_argument("--scenario", default="smoke")
    ap.add_argument("--steps", help="a JSON list of steps instead of a named scenario")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    a = ap.parse_args(argv)
    params = dict(p.split("=", 1) for p in a.param)
    steps = json.loads(a.steps) if a.steps else SCENARIOS[a.scenario]
    obs: dict[str, Any] = {"scenario": "custom" if a.steps else a.scenario}
    return run_and_report(drive(a, steps, params, obs), obs)


if __name__ == "__main__":
    sys.exit(main())
