from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class YuzuConfig(AppConfig):
    name = "yuzu"
    verbose_name = "yuzu: accounts, RBAC, tokens, audit"

    def ready(self) -> None:
        # deferred: the checks read models (the secrets' key versions), which exist only once apps are ready
        from . import checks  # noqa: F401  (registers the start-up checks)

        post_migrate.connect(_seed_roles, sender=self)


def _seed_roles(sender: AppConfig, **kwargs: Any) -> None:
    # deferred: yuzu.rbac imports models, and apps.py is imported before any model can be
    from .rbac import seed_builtin_roles

    seed_builtin_roles()
