"""The authorization server's endpoints: authorize (the admin's login, then a consent page), dynamic client
registration (RFC 7591), token and revocation (django-oauth-toolkit's views on yuzu's validator)."""

import re
from functools import wraps
from urllib.parse import urlsplit

from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import HttpResponse, HttpResponseRedirect, JsonResponse
from django.http.request import RawPostDataException
from django.shortcuts import render
from django.utils.http import urlencode
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from oauth2_provider.exceptions import FatalClientError, OAuthToolkitError
from oauth2_provider.http import OAuth2ResponseRedirect
from oauth2_provider.models import get_access_token_model, get_application_model
from oauth2_provider.views import TokenView as ToolkitTokenView
from oauth2_provider.views.mixins import OAuthLibMixin
from oauthlib.common import add_params_to_uri
from oauthlib.oauth2.rfc6749 import errors

from yuzu import jsondata
from yuzu.audit import audit
from yuzu.auth import MFA_SESSION_KEY, OAUTH_RESOURCES, tier_ceiling, tier_scope
from yuzu.models import MCP_TOKEN_MAX_DAYS
from yuzu.policy import TIER_ORDER
from yuzu.rbac import Principal
from yuzu.stepup import mfa_is_fresh

from . import ratelimit
from .discovery import AUTH_METHODS, audience_for, issuer
from .models import Authorization, printable

Application = get_application_model()
LOOPBACK = ("127.0.0.1", "::1", "localhost")
TIER_HELP = {
    "readonly": "Read tools only: fleet state, executions, audit. Changes nothing.",
    "operator": "Reads, plus routine operations: tags, running instructions (deleting a tag waits for an approval).",
    "supervised": "Everything your roles allow; risky calls (running instructions, deleting, security and access "
                  "changes) wait until another person approves them.",
}
DEFAULT_DAYS = 30
S256_CHALLENGE = re.compile(r"[A-Za-z0-9_-]{43}")  # BASE64URL(SHA-256(verifier)), unpadded (RFC 7636 §4.2)


def refuse_nul(view):
    """A parameter with a NUL character is malformed (and PostgreSQL could not even look it up): refused first."""
    @wraps(view)
    def checked(request, *args, **kwargs):
        try:
            _ = request.body  # read (bounded) before the form parsers, so request.body stays readable for the view
        except RawPostDataException:
            pass  # a multipart form the CSRF check already parsed (the consent page): nothing reads the body
        if any("\x00" in part for params in (request.GET, request.POST) for key, values in params.lists()
               for part in (key, *values)):
            return JsonResponse({"error": "invalid_request", "error_description": "a parameter contains a NUL "
                                                                                "character"}, status=400)
        return view(request, *args, **kwargs)
    return checked


def redirect_uri_problem(uri):
    """yuzu's rule beyond exact matching: https, or http to this machine (a native client's loopback callback), on
    a port from 1 to 65535 if it names one. (A loopback URI may name any port at the time of the request, RFC 8252
    §7.3, which django-oauth-toolkit's matching lets through unread: this is where it is checked.)"""
    try:
        parts = urlsplit(uri)
        port = parts.port  # a port that is no number from 0 to 65535 raises
    except ValueError:
        port = 0
    if port == 0:
        return "a redirect URI must be a URI with a valid host and a port from 1 to 65535"
    if "@" in parts.netloc:
        return "a redirect URI must not carry a user name or password"
    if parts.scheme == "https" or (parts.scheme == "http" and parts.hostname in LOOPBACK):
        return None
    return "a redirect URI must be https, or http only to a loopback address (127.0.0.1, [::1], localhost)"


class ConsentForm(forms.Form):
    tier = forms.ChoiceField(widget=forms.RadioSelect)
    days = forms.IntegerField(min_value=1, max_value=MCP_TOKEN_MAX_DAYS, initial=DEFAULT_DAYS, label="Expires after",
                              widget=forms.NumberInput(attrs={"min": 1, "max": MCP_TOKEN_MAX_DAYS, "size": 4}))
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("deny", "Deny")])

    def __init__(self, *args, tiers, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tier"].choices = [(t, f"{t}: {TIER_HELP[t]}") for t in tiers]
        self.fields["tier"].initial = tiers[-1] if tiers else None


class AuthorizeView(OAuthLibMixin, View):
    """GET shows, POST decides. Both validate the whole request first: an unknown client or a redirect URI that was
    not registered is an error page here (never a redirect); any other fault goes back to the client."""

    def get(self, request):
        return self.handle(request)

    def post(self, request):
        return self.handle(request)

    def handle(self, request):
        try:
            scopes, credentials = self.validate_authorization_request(request)
        except FatalClientError as exc:
            return self.error_page(request, exc.oauthlib_error.error, exc.oauthlib_error.description)
        except OAuthToolkitError as exc:
            return self.error_redirect(request, exc.oauthlib_error, None)
        oauth_request = credentials["request"]
        app = oauth_request.client
        problem = redirect_uri_problem(credentials["redirect_uri"])
        if problem:
            return self.error_page(request, "invalid_request", problem)
        base = issuer(request)
        resources = request.GET.getlist("resource")
        resource = resources[0] if resources else base + OAUTH_RESOURCES["mcp-v1"]
        audience = audience_for(resource, base) if len(resources) <= 1 and len(resource) <= 255 else None
        if not oauth_request.state:
            return self.error_redirect(request, errors.InvalidRequestError(
                description="state is required", request=oauth_request), app)
        if credentials.get("code_challenge_method") != "S256":
            return self.error_redirect(request, errors.InvalidRequestError(
                description="PKCE with code_challenge_method=S256 is required", request=oauth_request), app)
        if not S256_CHALLENGE.fullmatch(credentials.get("code_challenge") or ""):
            return self.error_redirect(request, errors.InvalidRequestError(
                description="code_challenge must be the 43 base64url characters of an S256 challenge",
                request=oauth_request), app)
        if {oauth_request.response_mode, *request.GET.getlist("response_mode")} - {None, "query"}:
            # The code would travel in the fragment, which browsers carry across redirects: only query is offered.
            # (The code is made from the query alone; the validation above read the form's fields too.)
            return self.error_redirect(request, errors.InvalidRequestError(
                description="response_mode must be query", request=oauth_request), app)
        if audience is None:
            return self.error_redirect(request, errors.CustomOAuth2Error(
                error="invalid_target", request=oauth_request,
                description=f"resource must be one of {', '.join(base + p for p in OAUTH_RESOURCES.values())}"), app)

        user = request.user
        if not (user.is_authenticated and user.is_active and user.is_staff and user.is_verified()):
            return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
        if not mfa_is_fresh(Principal(user=user, via="session", mfa_verified_at=request.session.get(MFA_SESSION_KEY))):
            return HttpResponseRedirect("/admin/stepup/?" + urlencode({"next": request.get_full_path()}))

        asked = [t for t in TIER_ORDER if tier_scope(t) in scopes] or [TIER_ORDER[-1]]
        ceiling = tier_ceiling(user)
        tiers = [] if ceiling is None else list(TIER_ORDER[:min(TIER_ORDER.index(asked[-1]),
                                                                TIER_ORDER.index(ceiling)) + 1])
        form = ConsentForm(request.POST if request.method == "POST" else None, tiers=tiers)
        if request.method == "POST" and request.POST.get("decision") == "deny":
            audit(user, "oauth.consent", "denied", target_type="OAuthClient", target_id=app.client_id[:256],
                  detail=f"endpoint={OAUTH_RESOURCES[audience]}/")
            return self.error_redirect(request, errors.AccessDeniedError(request=oauth_request), app)
        if request.method == "POST" and tiers and form.is_valid():
            return self.approve(request, app, credentials, audience, resource, form.cleaned_data)
        context = {**admin.site.each_context(request), "title": "Connect an AI client", "form": form, "app": app,
                   "client_name": printable(app.name, 100) or "An unnamed client",
                   "registration": self.registration(app), "redirect_host": urlsplit(credentials["redirect_uri"]).netloc,
                   "endpoint": OAUTH_RESOURCES[audience] + "/", "asked": asked[-1], "ceiling": ceiling,
                   "max_days": MCP_TOKEN_MAX_DAYS, "access_minutes": settings.YUZU_OAUTH_ACCESS_TOKEN_SECONDS // 60}
        return render(request, "oauth/consent.html", context, status=400 if form.is_bound else 200)

    def approve(self, request, app, credentials, audience, resource, data):
        keep = ("client_id", "redirect_uri", "response_type", "state", "code_challenge", "code_challenge_method")
        with transaction.atomic():
            auth = Authorization.consent(request.user, app, audience=audience, resource=resource, tier=data["tier"],
                                         days=data["days"])
            grant = {**{k: credentials[k] for k in keep if credentials.get(k)}, "resource": [resource],
                     "yuzu_authorization": auth}
            try:
                uri, _headers, _body, _status = self.create_authorization_response(
                    request, tier_scope(data["tier"]), grant, allow=True)
            except OAuthToolkitError as exc:
                transaction.set_rollback(True)
                return self.error_redirect(request, exc.oauthlib_error, app)
            if not Authorization.objects.filter(pk=auth.pk, code_hash__isnull=False).exists():
                transaction.set_rollback(True)  # re-validation answered with an error redirect: nothing granted
                return OAuth2ResponseRedirect(uri, app.get_allowed_schemes())
        audit(request.user, "oauth.consent", "success", target_type="OAuthAuthorization", target_id=auth.pk,
              detail=f"client={app.client_id[:200]} mcp_tier={data['tier']} days={data['days']} "
                     f"endpoint={OAUTH_RESOURCES[audience]}/")
        return OAuth2ResponseRedirect(uri, app.get_allowed_schemes())

    @staticmethod
    def registration(app):
        if app.registration_source == Application.RegistrationSource.CIMD:
            return f"identified by its metadata document at {urlsplit(app.client_id).netloc}"
        if app.registration_source == Application.RegistrationSource.DCR:
            return f"registered itself on {app.created:%Y-%m-%d %H:%M} UTC"
        return "registered by an administrator"

    def error_page(self, request, error, description):
        audit(request.user if request.user.is_authenticated else "anonymous", "oauth.authorize", "denied",
              target_type="OAuthClient", target_id=request.GET.get("client_id", "")[:256],
              detail=f"error={error} {description or ''}"[:500])
        return render(request, "oauth/error.html", {**admin.site.each_context(request), "title": "Cannot connect",
                                                   "error": error, "description": description}, status=400)

    def error_redirect(self, request, error, app):
        """Back to the client's (registered, checked) redirect URI with the error, its state and our issuer — an
        error page instead when that URI is not one yuzu sends a browser to (a loopback URI's port out of range)."""
        if not error.redirect_uri:
            return self.error_page(request, error.error, error.description)
        problem = redirect_uri_problem(error.redirect_uri)
        if problem:
            return self.error_page(request, "invalid_request", problem)
        audit(request.user if request.user.is_authenticated else "anonymous", "oauth.authorize", "denied",
              target_type="OAuthClient", target_id=request.GET.get("client_id", "")[:256],
              detail=f"error={error.error} {error.description or ''}"[:500])
        url = add_params_to_uri(error.redirect_uri, [*error.twotuples, ("iss", issuer(request))])
        return OAuth2ResponseRedirect(url, app.get_allowed_schemes() if app else ["http", "https"])


# --- dynamic client registration (RFC 7591) -------------------------------------------------------------------

MAX_REGISTRATION = 16 * 1024


def registration_error(error, description, status=400):
    return JsonResponse({"error": error, "error_description": description}, status=status)


def client_metadata(data):
    """RFC 7591 metadata → Application fields, or raise ValueError(error, description). Only what yuzu supports:
    the authorization code grant with refresh, response type code, https (or loopback http) redirect URIs."""
    uris = data.get("redirect_uris")
    if not isinstance(uris, list) or not 1 <= len(uris) <= 10 or not all(
            isinstance(u, str) and 0 < len(u) <= 2000 and u.isprintable() and " " not in u for u in uris):
        raise ValueError("invalid_redirect_uri", "redirect_uris must be a list of 1 to 10 URIs")
    for uri in uris:
        problem = redirect_uri_problem(uri) or ("a redirect URI must not have a fragment" if "#" in uri else None) \
            or ("a redirect URI needs a host" if not urlsplit(uri).hostname else None)
        if problem:
            raise ValueError("invalid_redirect_uri", f"{problem}: {uri[:200]}")
    grants = data.get("grant_types", ["authorization_code", "refresh_token"])
    if not isinstance(grants, list) or "authorization_code" not in grants or \
            not set(grants) <= {"authorization_code", "refresh_token"}:
        raise ValueError("invalid_client_metadata", "grant_types must be authorization_code (and refresh_token)")
    if data.get("response_types", ["code"]) != ["code"]:
        raise ValueError("invalid_client_metadata", "response_types must be [\"code\"]")
    method = data.get("token_endpoint_auth_method", "client_secret_basic")
    if method not in AUTH_METHODS:
        raise ValueError("invalid_client_metadata", f"token_endpoint_auth_method must be one of {', '.join(AUTH_METHODS)}")
    name = data.get("client_name", "")
    if not isinstance(name, str) or len(name) > 100:
        raise ValueError("invalid_client_metadata", "client_name must be a string of at most 100 characters")
    return {"redirect_uris": " ".join(uris), "name": printable(name, 100), "authorization_grant_type":
            Application.GRANT_AUTHORIZATION_CODE, "client_type": Application.CLIENT_PUBLIC if method == "none"
            else Application.CLIENT_CONFIDENTIAL}, method


@csrf_exempt
@require_POST
def register(request):
    address = request.META.get("REMOTE_ADDR", "") or "unknown"
    if not ratelimit.admit(address):
        audit("anonymous", "oauth.client.register", "denied", target_type="OAuthClient",
              detail=f"via=dynamic_registration address={address} reason=rate_limited")
        response = registration_error("temporarily_unavailable", "too many client registrations; try again later", 429)
        response["Retry-After"] = str(ratelimit.retry_after())
        return response
    try:
        if len(request.body) > MAX_REGISTRATION:
            raise ValueError("invalid_client_metadata", f"the registration request is larger than {MAX_REGISTRATION} "
                                                        "bytes")
        try:
            data = jsondata.loads(request.body)
        except (ValueError, RecursionError):  # nested a few thousand deep: the parser's recursion limit
            raise ValueError("invalid_client_metadata", "the body must be a JSON object") from None
        if not isinstance(data, dict):
            raise ValueError("invalid_client_metadata", "the body must be a JSON object")
        fields, method = client_metadata(data)
    except ValueError as exc:
        error, description = exc.args
        audit("anonymous", "oauth.client.register", "failure", target_type="OAuthClient",
              detail=f"via=dynamic_registration address={address} error={error} {description}"[:500])
        return registration_error(error, description)
    app = Application(registration_source=Application.RegistrationSource.DCR, **fields)
    secret = app.client_secret if app.client_type == Application.CLIENT_CONFIDENTIAL else ""
    if not secret:
        app.client_secret = ""
    try:
        app.full_clean()
    except ValidationError as exc:
        audit("anonymous", "oauth.client.register", "failure", target_type="OAuthClient",
              detail=f"via=dynamic_registration address={address} {'; '.join(exc.messages)}"[:500])
        return registration_error("invalid_redirect_uri", "; ".join(exc.messages))
    app.save()  # hashes the secret
    audit("anonymous", "oauth.client.register", "success", target_type="OAuthClient", target_id=app.client_id,
          detail=f"via=dynamic_registration name={app.name!r} redirect_uris={app.redirect_uris[:512]} "
                 f"auth_method={method} address={address}")
    body = {"client_id": app.client_id, "client_id_issued_at": int(app.created.timestamp()),
            "client_name": app.name, "redirect_uris": app.redirect_uris.split(),
            "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
            "token_endpoint_auth_method": method}
    if secret:
        body.update(client_secret=secret, client_secret_expires_at=0)
    response = JsonResponse(body, status=201)
    response["Cache-Control"] = "no-store"
    return response


class TokenView(ToolkitTokenView):
    """django-oauth-toolkit's token endpoint, save for its device flow (below) and one race: after issuing
    (committed), it reads the new access token back, and a concurrent use of the same refresh token may have revoked
    the whole connection — deleting that token — in between (oauth.validators: reuse). That token is dead already:
    the answer is invalid_grant, not a 500 from the read."""

    def post(self, request, *args, **kwargs):
        """Every grant goes to yuzu's server, which offers two: django-oauth-toolkit's view sends a device_code grant
        to its own device flow first (a 500 without the device_code parameter), though yuzu has no device grant."""
        return self.authorization_flow_token_response(request)

    def authorization_flow_token_response(self, request, *args, **kwargs):
        try:
            return super().authorization_flow_token_response(request, *args, **kwargs)
        except get_access_token_model().DoesNotExist:
            error = errors.InvalidGrantError(description="refresh token reused: the connection is revoked")
            return HttpResponse(error.json, status=error.status_code, content_type="application/json",
                                headers={"Cache-Control": "no-store", "Pragma": "no-cache"})
