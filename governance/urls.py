from django.urls import path

from . import api

urlpatterns = [
    path("engine-principals", api.engine_principals_view),
    path("engine-principals/audit/no-admin", api.engine_no_admin_view),
    path("engine-principals/<str:principal_id>", api.engine_principal_detail),
    path("engine-principals/<str:principal_id>/credentials", api.engine_credentials_view),
    path("engine-principals/<str:principal_id>/credentials/rotate", api.engine_rotate_view),
    path("engine-principals/<str:principal_id>/credentials/confirm", api.engine_confirm_view),
    path("engine-principals/<str:principal_id>/transfer-owner", api.engine_transfer_view),
    path("engine-principals/<str:principal_id>/roles", api.engine_roles_view),
    path("engine-principals/<str:principal_id>/roles/<str:role>", api.engine_role_detail),
    path("access-reviews/export", api.access_review_export_view),
    path("access-reviews", api.access_reviews_view),
    path("access-reviews/<str:campaign_id>", api.access_review_detail),
    path("access-reviews/<str:campaign_id>/attestations", api.access_review_attest_view),
    path("access-reviews/<str:campaign_id>/close", api.access_review_close_view),
    path("secrets/kek/rotate", api.kek_rotate),
    path("secrets/kek/rewrap", api.kek_rewrap),
    path("secrets/kek/status", api.kek_status),
]
