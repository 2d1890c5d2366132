from django.apps import AppConfig
from django.db.models.signals import post_migrate

from .profiles import seed_profiles


class BridgeConfig(AppConfig):
    name = "bridge"
    verbose_name = "Bridge: primary and worker sessions"

    def ready(self):
        post_migrate.connect(_seed_profiles, sender=self)


def _seed_profiles(sender, **kwargs):
    seed_profiles()
