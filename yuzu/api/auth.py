from rest_framework import authentication, exceptions

from yuzu.auth import AuthError, authenticate


class _CsrfCheck(authentication.SessionAuthentication):
    pass


class YuzuAuthentication(authentication.BaseAuthentication):
    """Token (Bearer or X-Yuzu-Token) first, else the OTP-verified admin session (CSRF enforced)."""

    def authenticate(self, request):
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            principal = authenticate(headers, request.COOKIES)
        except AuthError as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
        if principal is None:
            return None
        if principal.via == "session":
            _CsrfCheck().enforce_csrf(request)
        request._request.principal = principal
        return (principal.user, principal)

    def authenticate_header(self, request):
        return 'Bearer realm="yuzu"'
