from django.urls import path

from . import api

urlpatterns = [
    path("approvals", api.approvals_view),
    path("approvals/pending/count", api.pending_count_view),
    path("approvals/<str:approval_id>", api.approval_detail),
    path("approvals/<str:approval_id>/approve", api.approve_view),
    path("approvals/<str:approval_id>/reject", api.reject_view),
    path("approvals/<str:approval_id>/withdraw", api.withdraw_view),
    path("approvals/<str:approval_id>/revoke", api.revoke_approval_view),
]
