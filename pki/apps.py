from django.apps import AppConfig


class PkiConfig(AppConfig):
    name = "pki"
    verbose_name = "PKI: the internal CA, issued certificates, revocation"

    def ready(self):
        from yuzu.metrics import CA_CERTS_EXPIRING  # deferred: the app registry must be ready first

        from .models import IssuedCert  # deferred: models load after apps are ready
        CA_CERTS_EXPIRING.set_function(IssuedCert.objects.expiring_count)
