"""REST twins of the DEX tools (docs/dex.md): GET only, each view a thin wrapper over the dex.services function its
MCP tool calls, answering the same object inside the envelope. The gate is the tools': GuaranteedState:Read (a
tier-checked read), and the routes whose MCP twin refuses service-scoped tokens refuse them here too."""

from rest_framework.decorators import api_view

from yuzu import rbac
from yuzu.api.contract import contract, tool_output
from yuzu.api.envelope import cid_of, ok
from yuzu.api.views import int_param, principal_of

from . import services

WINDOW = ("window", str, "24h | 7d | 30d | all (default 7d)")
OS = ("os", str, "all | windows | linux | macos (default all)")
KEY = ("key", str, "cohort key: a tag key (default model) or yuzu:os, yuzu:agent_version, yuzu:group")
LIMIT = ("limit", int, "1-500, default 50")


def _gate(request, service_scoped=True):
    p = principal_of(request)
    rbac.check(p, "GuaranteedState", "Read", any_scope=True, confined=service_scoped)
    return p


def _q(request, name):
    value = request.query_params.get(name)
    return value if value is None or len(value) <= 1024 else value[:1024]


@contract("GET", "DEX signal catalogue rollup (list_dex_signals)", response=tool_output("list_dex_signals"),
          query=[WINDOW, OS])
@api_view(["GET"])
def signals_view(request):
    return ok(services.list_signals(_gate(request), _q(request, "window"), _q(request, "os")))


@contract("GET", "DEX signal coverage per platform (get_dex_signal_scope)", response=tool_output("get_dex_signal_scope"),
          query=[WINDOW])
@api_view(["GET"])
def scope_view(request):
    return ok(services.signal_scope(_gate(request), _q(request, "window")))


@contract("GET", "One DEX signal type in detail (get_dex_signal_detail)", response=tool_output("get_dex_signal_detail"),
          query=[WINDOW, OS, ("limit", int, "0-500, default 50")])
@api_view(["GET"])
def signal_detail_view(request, obs_type):
    p = _gate(request, service_scoped=False)
    return ok(services.signal_detail(p, obs_type, _q(request, "window"), _q(request, "os"),
                                     int_param(request, "limit", 50, 0, 500), cid=cid_of(request)))


@contract("GET", "Fleet device performance now (get_dex_perf_fleet)", response=tool_output("get_dex_perf_fleet"))
@api_view(["GET"])
def perf_fleet_view(request):
    return ok(services.perf_fleet(_gate(request)))


@contract("GET", "Device performance by cohort (get_dex_perf_cohorts)", response=tool_output("get_dex_perf_cohorts"),
          query=[KEY])
@api_view(["GET"])
def perf_cohorts_view(request):
    return ok(services.perf_cohorts(_gate(request), _q(request, "key")))


@contract("GET", "Two device cohorts head to head (get_dex_perf_cohort_diff)",
          response=tool_output("get_dex_perf_cohort_diff"),
          query=[KEY, ("a", str, "cohort A (required; empty = untagged)"), ("b", str, "cohort B, the baseline")])
@api_view(["GET"])
def perf_cohort_diff_view(request):
    p = _gate(request)
    return ok(services.perf_cohort_diff(p, _q(request, "a"), _q(request, "b"), _q(request, "key")))


@contract("GET", "Devices behind a performance drill (list_dex_perf_devices)",
          response=tool_output("list_dex_perf_devices"),
          query=[("metric", str, "cpu | commit | disk_lat"), ("filter", str, "not_reporting"),
                 ("cohort_key", str, "default model"), ("cohort_value", str, ""), LIMIT])
@api_view(["GET"])
def perf_devices_view(request):
    p = _gate(request, service_scoped=False)
    return ok(services.perf_devices(p, _q(request, "metric"), _q(request, "filter"), _q(request, "cohort_key"),
                                    _q(request, "cohort_value"), int_param(request, "limit", 50, 1, 500),
                                    cid=cid_of(request)))


@contract("GET", "Apps with performance history (list_dex_perf_apps)", response=tool_output("list_dex_perf_apps"))
@api_view(["GET"])
def perf_apps_view(request):
    return ok(services.list_apps(_gate(request)))


@contract("GET", "Fleet performance trend of one app (get_dex_app_perf)", response=tool_output("get_dex_app_perf"),
          query=[("app", str, "required"), ("version", str, "exact, trimmed and lower-cased")])
@api_view(["GET"])
def perf_app_view(request):
    return ok(services.app_perf(_gate(request), _q(request, "app"), _q(request, "version")))


@contract("GET", "App performance trend in one management group (get_dex_group_app_perf)",
          response=tool_output("get_dex_group_app_perf"),
          query=[("group_id", str, "required"), ("app", str, "required"), ("version", str, "")])
@api_view(["GET"])
def perf_group_view(request):
    p = _gate(request)
    return ok(services.group_app_perf(p, _q(request, "group_id"), _q(request, "app"), _q(request, "version")))


@contract("GET", "Before/after evidence for an app upgrade (compare_app_perf_versions)",
          response=tool_output("compare_app_perf_versions"),
          query=[("app", str, "required"), ("group", str, "required"), ("baseline", str, "required"),
                 ("candidate", str, "required"), ("window", int, "1-31 days, default 7")])
@api_view(["GET"])
def perf_compare_view(request):
    p = _gate(request)
    return ok(services.compare_versions(p, _q(request, "app"), _q(request, "group"), _q(request, "baseline"),
                                        _q(request, "candidate"), int_param(request, "window", 7, 1, 31),
                                        cid=cid_of(request)))


@contract("GET", "Fleet network quality now (get_network_fleet)", response=tool_output("get_network_fleet"))
@api_view(["GET"])
def network_fleet_view(request):
    return ok(services.network_fleet(_gate(request)))


@contract("GET", "Devices behind a network drill (list_network_devices)", response=tool_output("list_network_devices"),
          query=[("metric", str, "rtt | retrans | throughput"), ("filter", str, "not_reporting"),
                 ("cooc", str, "device | app | network_only | degraded"), KEY, ("cohort_value", str, ""), LIMIT])
@api_view(["GET"])
def network_devices_view(request):
    p = _gate(request, service_scoped=False)
    return ok(services.network_devices(p, _q(request, "metric"), _q(request, "filter"), _q(request, "cooc"),
                                       _q(request, "key"), _q(request, "cohort_value"),
                                       int_param(request, "limit", 50, 1, 500), cid=cid_of(request)))
