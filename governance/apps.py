from django.apps import AppConfig


class GovernanceConfig(AppConfig):
    name = "governance"
    verbose_name = "Governance: engine principals, access reviews"
    default_auto_field = "django.db.models.BigAutoField"
