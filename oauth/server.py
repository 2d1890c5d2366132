"""The oauthlib server yuzu runs: the authorization code grant (PKCE enforced by the validator) and the refresh
token grant, bearer tokens, and token revocation (RFC 7009). Nothing else exists here to be misused: no implicit,
password, client credentials or device grant."""

from oauthlib.oauth2.rfc6749.endpoints import AuthorizationEndpoint, RevocationEndpoint, TokenEndpoint
from oauthlib.oauth2.rfc6749.errors import OAuth2Error
from oauthlib.oauth2.rfc6749.grant_types import AuthorizationCodeGrant, RefreshTokenGrant
from oauthlib.oauth2.rfc6749.tokens import BearerToken


def access_seconds(request):
    """expires_in of an access token: the configured lifetime, cut at the end of the consent."""
    return request.yuzu_authorization.access_seconds()


class Server(AuthorizationEndpoint, TokenEndpoint, RevocationEndpoint):
    def __init__(self, request_validator, **ignored):  # DOT passes its generic server kwargs
        code = AuthorizationCodeGrant(request_validator)
        refresh = RefreshTokenGrant(request_validator)
        bearer = BearerToken(request_validator, expires_in=access_seconds)
        AuthorizationEndpoint.__init__(self, default_response_type="code", response_types={"code": code},
                                       default_token_type=bearer)
        TokenEndpoint.__init__(self, default_grant_type="authorization_code", default_token_type=bearer,
                               grant_types={"authorization_code": code, "refresh_token": refresh})
        RevocationEndpoint.__init__(self, request_validator)

    def create_token_response(self, *args, **kwargs):
        """A refusal raised while issuing (a code or refresh token a concurrent request used first: oauth.validators)
        gets the same JSON answer as one raised while validating; oauthlib passes it up without its headers."""
        try:
            return super().create_token_response(*args, **kwargs)
        except OAuth2Error as exc:
            headers = {"Content-Type": "application/json", "Cache-Control": "no-store", "Pragma": "no-cache"}
            return {**headers, **exc.headers}, exc.json, exc.status_code
