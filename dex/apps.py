from django.apps import AppConfig


class DexConfig(AppConfig):
    name = "dex"
    verbose_name = "Digital experience (DEX)"

    def ready(self):
        from . import receivers  # noqa: F401  # deferred: signal receivers connect once the app registry is ready
