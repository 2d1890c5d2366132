from django.urls import path

from . import api

urlpatterns = [
    path("plugin-config", api.config_list),
    path("plugin-config/<str:plugin>/kill-switch", api.kill_switch),
    path("plugin-config/<str:plugin>/<str:key>/secret", api.secret_detail),
    path("plugin-config/<str:plugin>/<str:key>", api.config_detail),
    path("upload-grants", api.grants),
    path("upload-grants/<str:grant_id>", api.grant_detail),
    path("uploads", api.upload_open),
    path("uploads/<str:upload_id>", api.upload_session),
    path("uploads/<str:upload_id>/chunk", api.upload_chunk),
    path("uploads/<str:upload_id>/commit", api.upload_commit),
    path("schedules", api.schedule_list),
    path("schedules/<str:schedule_id>", api.schedule_detail),
    path("schedules/<str:schedule_id>/enable", api.schedule_enable),
    path("inventory/software", api.software_view),
    path("sle/agents/<str:agent_id>", api.sle_agent),
]
