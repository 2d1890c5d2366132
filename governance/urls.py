from django.urls import path

from . import api

urlpatterns = [
    path("engine-principals", api.principals_view),
    path("engine-principals/audit/no-admin", api.no_admin_view),
    path("engine-principals/<str:principal_id>", api.principal_detail),
    path("engine-principals/<str:principal_id>/credentials", api.credentials_view),
    path("engine-principals/<str:principal_id>/credentials/rotate", api.rotate_view),
    path("engine-principals/<str:principal_id>/credentials/confirm", api.confirm_view),
    path("engine-principals/<str:principal_id>/transfer-owner", api.transfer_view),
    path("engine-principals/<str:principal_id>/roles", api.roles_view),
    path("engine-principals/<str:principal_id>/roles/<str:role>", api.role_detail),
    path("access-reviews/export", api.export_view),
    path("access-reviews", api.reviews_view),
    path("access-reviews/<str:campaign_id>", api.review_detail),
    path("access-reviews/<str:campaign_id>/attestations", api.attest_view),
    path("access-reviews/<str:campaign_id>/close", api.close_view),
    path("secrets/kek/rotate", api.kek_rotate),
    path("secrets/kek/rewrap", api.kek_rewrap),
    path("secrets/kek/status", api.kek_status),
]
