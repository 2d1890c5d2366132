from django.apps import AppConfig


class OauthConfig(AppConfig):
    name = "oauth"
    verbose_name = "OAuth: MCP clients and their connections"
