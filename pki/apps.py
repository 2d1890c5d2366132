from django.apps import AppConfig
from django.db import DatabaseError


class PkiConfig(AppConfig):
    name = "pki"
    verbose_name = "PKI: the internal CA, issued certificates, revocation"

    def ready(self):
        from yuzu.metrics import CA_CERTS_EXPIRING  # deferred: the app registry must be ready first

        from .models import IssuedCert  # deferred: models load after apps are ready
        def expiring():
            try:
                return IssuedCert.objects.expiring_count()
            except DatabaseError:  # /metrics keeps answering while the database is away
                return float("nan")

        CA_CERTS_EXPIRING.set_function(expiring)
