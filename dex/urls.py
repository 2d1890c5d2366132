from django.urls import path

from . import api

urlpatterns = [
    path("dex/signals", api.signals_view),
    path("dex/scope", api.scope_view),
    path("dex/signals/<str:obs_type>", api.signal_detail_view),
    path("dex/perf/fleet", api.perf_fleet_view),
    path("dex/perf/cohorts", api.perf_cohorts_view),
    path("dex/perf/cohort-diff", api.perf_cohort_diff_view),
    path("dex/perf/devices", api.perf_devices_view),
    path("dex/perf/apps", api.perf_apps_view),
    path("dex/perf/app", api.perf_app_view),
    path("dex/perf/group", api.perf_group_view),
    path("dex/perf/compare", api.perf_compare_view),
    path("network/fleet", api.network_fleet_view),
    path("network/devices", api.network_devices_view),
]
