from django.apps import AppConfig


class BridgeConfig(AppConfig):
    name = "bridge"
    verbose_name = "Bridge: primary and worker sessions"
