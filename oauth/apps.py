from django.apps import AppConfig
from oauth2_provider.apps import DOTConfig


class OauthConfig(AppConfig):
    default = True
    name = "oauth"
    verbose_name = "OAuth: connections of MCP clients"


class ClientsConfig(DOTConfig):
    """django-oauth-toolkit, named for what an administrator finds under it: the registered MCP clients."""

    default = False
    verbose_name = "OAuth: registered MCP clients"
