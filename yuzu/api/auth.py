from __future__ import annotations

from typing import TYPE_CHECKING

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from yuzu.auth import AuthError, authenticate

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from yuzu.rbac import Principal


class _CsrfCheck(authentication.SessionAuthentication):
    pass


class YuzuAuthentication(authentication.BaseAuthentication):
    """Token (Bearer or X-Yuzu-Token) first, else the OTP-verified admin session (CSRF enforced)."""

    def authenticate(self, request: Request) -> tuple[User, Principal] | None:
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            principal = authenticate(headers, request.COOKIES)
        except AuthError as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
        if principal is None:
            return None
        if principal.via == "session":
            _CsrfCheck().enforce_csrf(request)
        return (principal.user, principal)  # request.auth is the principal (yuzu.api.views.principal_of)

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="yuzu"'
