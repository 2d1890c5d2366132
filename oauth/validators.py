"""django-oauth-toolkit's request validator with yuzu's rules: every token is an ApiToken of one consent
(models.Authorization), bound to one MCP endpoint; PKCE is S256 and a wrong verifier burns the code; a reused code
or a replayed refresh token ends the connection; a revoked client, a revoked access token or an ended consent issues
nothing more. Every refusal is audited, without the secret that was presented."""

import hashlib

from django.db.models import F, Q
from oauth2_provider import cimd
from oauth2_provider.models import get_application_model, get_grant_model, get_refresh_token_model
from oauth2_provider.oauth2_validators import OAuth2Validator
from oauthlib.oauth2.rfc6749 import errors
from oauthlib.oauth2.rfc6749.grant_types.authorization_code import code_challenge_method_s256

from yuzu.audit import audit
from yuzu.models import hash_secret

from . import ratelimit
from .discovery import normalize
from .models import Authorization, ClientState, printable

Application = get_application_model()
Grant = get_grant_model()
RefreshToken = get_refresh_token_model()


class _ConcurrentReuse(Exception):
    """The refresh token (or code) was used by a concurrent request after this one validated it."""


def client_address(request):
    return request.headers.get("REMOTE_ADDR", "") or "unknown"


def grant_of(code, client):
    return Grant.objects.filter(code=hash_secret(code), application=client).first()


def refuse(request, reason, auth=None):
    audit(auth.user if auth is not None else "anonymous", "oauth.token", "denied", target_type="OAuthClient",
          target_id=str(request.client_id or "")[:256],
          detail=f"grant_type={request.grant_type} reason={reason}" + (f" authorization={auth.pk}" if auth else ""))


class Validator(OAuth2Validator):
    # --- clients ------------------------------------------------------------------------------------------------

    def _load_application(self, client_id, request):
        """A revoked client is unknown; the first sight of a client metadata document counts as a registration
        (rate-limited, audited)."""
        if not client_id or ClientState.is_revoked(client_id):  # (NUL characters never get here: views.refuse_nul)
            request.client = None
            return None
        first_sight = cimd.is_cimd_client_id(client_id) and not Application.objects.filter(client_id=client_id).exists()
        if first_sight and not getattr(request, "yuzu_registration_admitted", False):
            if not ratelimit.admit(client_address(request)):
                audit("anonymous", "oauth.client.register", "denied", target_type="OAuthClient",
                      target_id=client_id[:256], detail=f"via=metadata_document address={client_address(request)} "
                                                        "reason=rate_limited")
                return None
            request.yuzu_registration_admitted = True
        client = super()._load_application(client_id, request)
        if first_sight and client is not None and client.authorization_grant_type != Application.GRANT_AUTHORIZATION_CODE:
            client.delete()  # a document asking for a grant yuzu does not offer registers nothing
            audit("anonymous", "oauth.client_metadata", "failure", target_type="OAuthClient", target_id=client_id[:256],
                  detail="grant_types must be authorization_code (and refresh_token)")
            request.client = None
            return None
        if first_sight and client is not None:
            audit("anonymous", "oauth.client.register", "success", target_type="OAuthClient", target_id=client_id[:256],
                  detail=f"via=metadata_document name={printable(client.name, 64)!r} "
                         f"redirect_uris={client.redirect_uris[:512]} address={client_address(request)}")
        return client

    def validate_response_type(self, client_id, response_type, client, request, *args, **kwargs):
        return response_type == "code" and super().validate_response_type(client_id, response_type, client, request)

    def validate_scopes(self, client_id, scopes, client, request, *args, **kwargs):
        """Any scope may be asked for: the consent page grants one MCP tier (tier_scope), never more than the
        highest tier asked for; scopes yuzu does not know grant nothing."""
        return True

    # --- authorization codes ------------------------------------------------------------------------------------

    def _create_authorization_code(self, request, code, expires=None):
        """Codes are stored as their SHA-256 (Grant.code; every lookup below hashes first); the consent keeps the
        hash too, to recognise a code used twice after its grant is gone. yuzu is no OpenID provider: a nonce or
        claims the request carried mean nothing and are not kept (the nonce's column holds 255 characters)."""
        request.nonce, request.claims = None, None
        grant = super()._create_authorization_code(request, {**code, "code": hash_secret(code["code"])}, expires)
        Authorization.objects.filter(pk=request.yuzu_authorization.pk).update(code_hash=grant.code)
        return grant

    def validate_code(self, client_id, code, client, request, *args, **kwargs):
        auth = Authorization.objects.select_related("user", "application").filter(
            code_hash=hash_secret(code), application=client).first()
        grant = grant_of(code, client)
        if grant is None or auth is None:
            if auth is not None and auth.api_token_id is not None:
                # RFC 6749 §4.1.2: a code used twice revokes what it issued.
                auth.revoke("authorization code reused")
            refuse(request, "unknown, expired or already used authorization code", auth)
            return False
        problem = auth.problem() or ("code expired" if grant.is_expired() else None)
        if problem:
            grant.delete()
            refuse(request, problem, auth)
            return False
        verifier = request.code_verifier
        if verifier is not None and not (grant.code_challenge_method == "S256"
                                         and code_challenge_method_s256(verifier, grant.code_challenge)):
            grant.delete()  # one wrong verifier burns the code
            refuse(request, "PKCE code_verifier does not match the code_challenge", auth)
            return False
        self._bind_resource(request, auth)
        request.yuzu_authorization = auth
        return super().validate_code(client_id, hash_secret(code), client, request, *args, **kwargs)

    def get_code_challenge(self, code, request):
        return self._grant_still_there(code, request).code_challenge or None

    def get_code_challenge_method(self, code, request):
        return self._grant_still_there(code, request).code_challenge_method or None

    def _grant_still_there(self, code, request):
        """The code's grant, which validate_code found; a concurrent exchange may have used (or burnt) it since."""
        grant = grant_of(code, request.client)
        if grant is None:
            self._code_reused(request, request.yuzu_authorization)
            raise errors.InvalidGrantError(description="authorization code already used", request=request)
        return grant

    @staticmethod
    def _code_reused(request, auth):
        """A code another exchange used meanwhile: RFC 6749 §4.1.2, as for a code used twice one after the other —
        what it issued is revoked. Outside the issuing transaction (its rollback would undo the revocation)."""
        auth = Authorization.objects.select_related("user", "application").get(pk=auth.pk)
        if auth.api_token_id is not None:
            auth.revoke("authorization code reused")
        refuse(request, "authorization code used by a concurrent request", auth)

    def confirm_redirect_uri(self, client_id, code, redirect_uri, client, request, *args, **kwargs):
        grant = grant_of(code, client)
        if grant is None or redirect_uri != grant.redirect_uri:
            refuse(request, "redirect_uri differs from the authorization request's", request.yuzu_authorization)
            raise errors.InvalidGrantError(description="redirect_uri does not match the authorization request",
                                           request=request)
        return True

    def invalidate_authorization_code(self, client_id, code, request, *args, **kwargs):
        """Nothing left to do: _save_bearer_token claimed (deleted) the code before issuing anything."""

    # --- refresh tokens -----------------------------------------------------------------------------------------

    def validate_refresh_token(self, refresh_token, client, request, *args, **kwargs):
        checksum = hashlib.sha256(refresh_token.encode()).hexdigest()
        rt = (RefreshToken.objects.filter(token_checksum=checksum, application=client)
              .order_by(F("revoked").desc(nulls_first=True)).first())
        auth = (Authorization.objects.select_related("user", "application", "api_token")
                .filter(token_family=rt.token_family).first() if rt is not None and rt.token_family else None)
        if auth is None:
            refuse(request, "unknown refresh token")
            return False
        if rt.revoked is not None:
            # Rotated (or revoked) earlier and presented again: stolen, or replayed. The whole family ends.
            self._reused(request, auth)
            return False
        problem = auth.problem()
        if problem:
            if problem == "access token revoked":
                auth.revoke(problem)
            refuse(request, problem, auth)
            return False
        if not super().validate_refresh_token(refresh_token, client, request, *args, **kwargs):
            refuse(request, "refresh token not valid", auth)
            return False
        self._bind_resource(request, auth)
        request.yuzu_authorization = auth
        return True

    # --- issuing ------------------------------------------------------------------------------------------------

    @staticmethod
    def _reused(request, auth):
        auth.revoke("refresh token reused")
        refuse(request, "refresh token reused: the connection is revoked", auth)

    def _bind_resource(self, request, auth):
        """RFC 8707: a token request may only name the resource the consent was for."""
        asked = [v for k, v in (request.decoded_body or []) if k == "resource"]
        if any(normalize(r) != normalize(auth.resource) for r in asked):
            refuse(request, "resource differs from the consent's", auth)
            raise errors.CustomOAuth2Error(error="invalid_target", status_code=400, request=request,
                                           description=f"this grant is for {auth.resource} only")
        request.resource = [auth.resource]

    def save_bearer_token(self, token, request, *args, **kwargs):
        """The issuing transaction; a refresh token that a concurrent request rotated meanwhile, or a code it used,
        is reuse, refused and revoked after that transaction rolled back (inside it, the revocation and its audit
        row would roll back too)."""
        try:
            return super().save_bearer_token(token, request, *args, **kwargs)
        except _ConcurrentReuse:
            if request.grant_type == "authorization_code":
                self._code_reused(request, request.yuzu_authorization)
                raise errors.InvalidGrantError(description="authorization code already used",
                                               request=request) from None
            self._reused(request, request.yuzu_authorization)
            raise errors.InvalidGrantError(description="refresh token reused: the connection is revoked",
                                           request=request) from None

    def _save_bearer_token(self, token, request, *args, **kwargs):
        if request.grant_type == "refresh_token":
            # validate_refresh_token read the token without a lock: two simultaneous uses both pass it. Claim it
            # here, locked (PostgreSQL: FOR UPDATE waits for the other's commit, then sees it revoked; SQLite: the
            # IMMEDIATE transaction waits for it), so exactly one rotates it and the other is reuse.
            if not RefreshToken.objects.select_for_update().filter(
                    pk=request.refresh_token_instance.pk, revoked__isnull=True).values_list("pk", flat=True):
                raise _ConcurrentReuse
        if request.grant_type == "authorization_code":
            # Claim the code inside the issuing transaction: of two concurrent exchanges one issues, one fails.
            if not Grant.objects.filter(code=hash_secret(request.code), application=request.client).delete()[0]:
                raise _ConcurrentReuse
        return super()._save_bearer_token(token, request, *args, **kwargs)

    def _create_access_token(self, expires, request, token, source_refresh_token=None):
        auth = request.yuzu_authorization
        if request.grant_type == "authorization_code" and auth.api_token_id is not None:
            raise errors.InvalidGrantError(description="authorization code already used", request=request)
        try:
            token["access_token"] = auth.issue_access_token(expires)
        except ValueError:
            raise errors.InvalidGrantError(description="the connection was revoked", request=request) from None
        return super()._create_access_token(expires, request, token, source_refresh_token)

    def _create_refresh_token(self, request, refresh_token_code, access_token, previous_refresh_token):
        rt = super()._create_refresh_token(request, refresh_token_code, access_token, previous_refresh_token)
        auth = request.yuzu_authorization
        if auth.token_family is None:
            auth.token_family = rt.token_family
            Authorization.objects.filter(pk=auth.pk).update(token_family=rt.token_family)
        return rt

    def revoke_token(self, token, token_type_hint, request, *args, **kwargs):
        """RFC 7009: the client's own access or refresh token ends its connection; anything else is ignored."""
        checksum = hashlib.sha256(token.encode()).hexdigest()
        families = RefreshToken.objects.filter(token_checksum=checksum).values("token_family")
        auth = Authorization.objects.filter(application=request.client).filter(
            Q(api_token__token_hash=checksum) | Q(token_family__in=families)).first()
        if auth is not None:
            auth.revoke("revoked by the client")
