"""The CA's background check (Celery beat, or run_periodic in embedded mode): republish the CRL when it is
missing or within 24 h of its nextUpdate, so GET /api/v1/ca/crl never has to sign."""

from celery import shared_task

from . import ca


@shared_task(name="pki.tasks.refresh_crl", ignore_result=True)
def refresh_crl():
    if ca.CaRoot.objects.exists():  # no CA yet: nothing to publish (it is created on first use)
        ca.current_crl()
