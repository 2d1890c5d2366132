from django.apps import AppConfig


class ComplianceConfig(AppConfig):
    name = "compliance"
    verbose_name = "Compliance"

    def ready(self):
        from . import receivers  # noqa: F401  # deferred: signal receivers connect once the app registry is ready
