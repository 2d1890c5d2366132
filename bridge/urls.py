from django.urls import path

from . import api

urlpatterns = [
    path("bridge/members", api.members_view),
    path("bridge/members/<str:pane_id>", api.member_detail),
    path("bridge/members/<str:pane_id>/events", api.member_events),
]
