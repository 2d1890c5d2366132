"""The DEX dashboard in the admin (/admin/dex/devicefacts/): the fleet's perf and network now-views, the worst
devices and the signals of the last 24 h, for staff whose roles grant GuaranteedState:Read. Read-only; it shows
what dex.services.dashboard returns (the same confinement as the tools)."""

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse

from yuzu.admin_rbac import ReadOnlyAdmin, session_principal

from . import services
from .models import DeviceFacts

METRICS = (("cpu_pct", "CPU", "%"), ("commit_pct", "Memory commit", "%"), ("disk_lat_ms", "Disk latency", "ms/IO"))
NET = (("rtt_ms", "TCP RTT (median per device)", "ms"), ("retrans_pct", "TCP retransmits", "%"),
       ("throughput_bps", "Throughput", "B/s"))
WORST = (("cpu_pct", "CPU %"), ("commit_pct", "Memory commit %"), ("disk_lat_ms", "Disk latency ms"),
         ("rtt_ms", "RTT ms"), ("retrans_pct", "Retransmits %"))


@admin.register(DeviceFacts)
class DashboardAdmin(ReadOnlyAdmin):
    securable = "GuaranteedState"

    def changelist_view(self, request, extra_context=None):
        # This replaces Django's changelist, and with it the changelist's own permission check: without this line
        # any staff user read the dashboard (an Approver every device's hostname and load).
        if not self.has_view_permission(request):
            raise PermissionDenied
        data = services.dashboard(session_principal(request))
        rows = lambda spec, group: [  # noqa: E731
            {"label": label, "unit": unit, "stat": data[group][key]} for key, label, unit in spec]
        context = {**self.admin_site.each_context(request), "title": "Digital experience (DEX)", "data": data,
                   "perf_rows": rows(METRICS, "perf"), "net_rows": rows(NET, "net"),
                   "worst": [{"label": label, "devices": data["worst"][key]} for key, label in WORST],
                   "opts": self.model._meta, **(extra_context or {})}
        return TemplateResponse(request, "admin/dex/dashboard.html", context)
