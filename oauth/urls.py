from django.urls import path
from django.views.decorators.cache import never_cache
from oauth2_provider.views import RevokeTokenView

from . import discovery, views
from .views import refuse_nul

PRM = ".well-known/oauth-protected-resource"

urlpatterns = [
    path(PRM, discovery.protected_resource),
    path(f"{PRM}/mcp/v1", discovery.protected_resource, {"audience": "mcp-v1"}),
    path(f"{PRM}/mcp/v1/", discovery.protected_resource, {"audience": "mcp-v1"}),
    path(f"{PRM}/mcp/bridge", discovery.protected_resource, {"audience": "mcp-bridge"}),
    path(f"{PRM}/mcp/bridge/", discovery.protected_resource, {"audience": "mcp-bridge"}),
    path(".well-known/oauth-authorization-server", discovery.authorization_server),
    # the consent page is a signed-in person's, with its form's CSRF token: never kept by a browser or a proxy
    path("oauth/authorize", refuse_nul(never_cache(views.AuthorizeView.as_view())), name="oauth-authorize"),
    path("oauth/token", refuse_nul(views.TokenView.as_view()), name="oauth-token"),
    path("oauth/register", refuse_nul(views.register), name="oauth-register"),
    path("oauth/revoke", refuse_nul(RevokeTokenView.as_view()), name="oauth-revoke"),
]
