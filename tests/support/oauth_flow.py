"""Driving yuzu's authorization server in-process: a person signed in to the admin (password + authenticator), a
client registered, the authorization code flow with PKCE, and the token endpoint (docs/oauth.md)."""

import base64
import hashlib
import json
import secrets
import time
from urllib.parse import parse_qs, urlencode, urlsplit

from django.test import Client
from django_otp import DEVICE_ID_SESSION_KEY

from yuzu.auth import MFA_SESSION_KEY
from yuzu.models import TOTPDevice

HOST = "127.0.0.1:8000"
BASE = f"http://{HOST}"
REDIRECT = "http://127.0.0.1:9999/callback"
V1, BRIDGE = BASE + "/mcp/v1", BASE + "/mcp/bridge"


def anonymous(**kw):
    return Client(HTTP_HOST=HOST, **kw)


def signed_in(user, fresh=True, **kw):
    """A browser session of ``user`` that signed in with password + authenticator (``fresh``: just now)."""
    c = anonymous(**kw)
    c.force_login(user)
    device = TOTPDevice.objects.get_or_create(user=user, name="phone", defaults={"confirmed": True})[0]
    session = c.session
    session[DEVICE_ID_SESSION_KEY] = device.persistent_id
    session[MFA_SESSION_KEY] = time.time() - (0 if fresh else 3600)
    session.save()
    return c


def register(**meta):
    body = {"client_name": "Test client", "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none", **meta}
    return anonymous().post("/oauth/register", json.dumps(body), content_type="application/json")


def registered(**meta):
    r = register(**meta)
    assert r.status_code == 201, r.content
    return r.json()


def pkce():
    verifier = secrets.token_urlsafe(48)
    return verifier, base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")


class Flow:
    """One authorization request and what came of it."""

    def __init__(self, client_id, redirect=REDIRECT, resource=V1, scope=None, **params):
        self.client_id, self.redirect, self.resource = client_id, redirect, resource
        self.verifier, challenge = pkce()
        self.state = secrets.token_urlsafe(12)
        self.params = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect, "state": self.state,
                       "code_challenge": challenge, "code_challenge_method": "S256", "resource": resource,
                       "scope": scope, **params}
        self.params = {k: v for k, v in self.params.items() if v is not None}

    @property
    def url(self):
        return "/oauth/authorize?" + urlencode(self.params)

    def consent(self, browser):
        return browser.get(self.url)

    def decide(self, browser, decision="approve", tier="supervised", days=30):
        return browser.post(self.url, {"decision": decision, "tier": tier, "days": days})

    def approve(self, browser, **kw):
        """The code from the redirect back to the client (after checking state and iss)."""
        r = self.decide(browser, **kw)
        assert r.status_code == 302, (r.status_code, r.content[:2000])
        query = callback(r, self.redirect)
        assert query["state"] == self.state and query["iss"] == BASE, query
        return query["code"]

    def exchange(self, code, verifier=None, **extra):
        data = {"grant_type": "authorization_code", "code": code, "redirect_uri": self.redirect,
                "client_id": self.client_id, "code_verifier": verifier or self.verifier, "resource": self.resource,
                **extra}
        return token_request({k: v for k, v in data.items() if v is not None})


def callback(response, redirect=REDIRECT):
    """The query of a redirect to the client's redirect URI (asserting it goes there)."""
    location = response["Location"]
    assert location.startswith(redirect + "?"), location
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


def token_request(data):
    return anonymous().post("/oauth/token", data)


def refresh(client_id, refresh_token, **extra):
    return token_request({"grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": client_id,
                          **extra})


def connect(browser, client_id=None, tier="supervised", days=30, resource=V1):
    """The whole flow: (Flow, token response JSON)."""
    client_id = client_id or registered()["client_id"]
    flow = Flow(client_id, resource=resource)
    r = flow.exchange(flow.approve(browser, tier=tier, days=days))
    assert r.status_code == 200, r.content
    return flow, r.json()
