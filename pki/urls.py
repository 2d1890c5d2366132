from django.urls import path

from . import api

urlpatterns = [
    path("ca/root", api.root_view, name="ca-root"),
    path("ca/crl", api.crl_view, name="ca-crl"),
    path("ca/issued", api.issued_view),
    path("ca/revoke", api.revoke_view),
    path("ca/issue", api.issue_view),
]
