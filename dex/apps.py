from django.apps import AppConfig


class DexConfig(AppConfig):
    name = "dex"
    verbose_name = "Digital experience (DEX)"

    def ready(self):
        from fleet.orientation import POSTURE_SECTIONS  # deferred: the app registry must be ready first

        from . import receivers  # noqa: F401  # deferred: signal receivers connect once the app registry is ready
        from .services import posture  # deferred: models load after apps are ready

        POSTURE_SECTIONS["dex"] = posture
        _register_collector()


_collector = None


def _register_collector():
    """The fleet gauges (dex.metrics), once per process."""
    global _collector
    if _collector is None:
        from prometheus_client import REGISTRY  # deferred: only when the app is ready

        from .metrics import FleetCollector  # deferred: models load after apps are ready
        _collector = FleetCollector()
        REGISTRY.register(_collector)
