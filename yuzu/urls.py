from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularSwaggerView

from fleet import api as fleet_api

from . import admin as yuzu_admin  # noqa: F401  (installs the OTP admin site)
from . import views
from .api import openapi
from .api import views as api

api_v1 = [
    path("tokens", api.tokens_view),
    path("tokens/<str:token_id>", api.token_detail),
    path("tokens/<str:token_id>/rotate", api.token_rotate),
    path("tokens/<str:token_id>/confirm", api.token_confirm),
    path("rbac/check", api.rbac_check),
    path("rbac/roles", api.roles_view),
    path("rbac/roles/<str:name>/permissions", api.role_permissions_view),
    path("users/<str:username>/unlock", api.unlock_user),
    path("audit", api.audit_view),
    path("agents", fleet_api.agents_view),
    path("agents/<str:agent_id>", fleet_api.agent_detail),
    path("agents/<str:agent_id>/revoke-credential", fleet_api.agent_revoke_credential),
    path("management-groups", fleet_api.groups_view),
    path("management-groups/<str:group_id>", fleet_api.group_detail),
    path("management-groups/<str:group_id>/members", fleet_api.group_members),
    path("management-groups/<str:group_id>/roles", fleet_api.group_roles),
    path("executions", fleet_api.executions_view),
    path("executions/<str:execution_id>", fleet_api.execution_detail),
    path("executions/<str:execution_id>/cancel", fleet_api.execution_cancel),
    path("executions/<str:execution_id>/responses", fleet_api.execution_responses),
    path("executions/<str:execution_id>/aggregate", fleet_api.execution_aggregate),
    path("bundles", fleet_api.bundles_view),
    path("bundles/<str:bundle_id>", fleet_api.bundle_detail),
    path("bundles/<str:bundle_id>/cancel", fleet_api.bundle_cancel),
    path("tags", fleet_api.tags_view),
    path("tags/<str:agent_id>/<str:key>", fleet_api.tag_detail),
    path("inventory", fleet_api.inventory_view),
    path("inventory/tables", fleet_api.inventory_tables),
    path("agents/<str:agent_id>/inventory", fleet_api.agent_inventory_view),
    path("scope/validate", fleet_api.scope_validate),
    path("scope/preview", fleet_api.scope_preview),
    path("discover/<str:kind>", fleet_api.discover_view),
    path("quarantine", fleet_api.quarantine_view),
    # Public and costly to build (seconds of CPU): built once per process, whoever asks (yuzu.api.openapi).
    path("openapi.json", openapi.JSONView.as_view(), name="openapi"),
    path("openapi.yaml", openapi.YAMLView.as_view(), name="openapi-yaml"),
    path("docs", SpectacularSwaggerView.as_view(url_name="openapi"), name="api-docs"),
]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("api/v1/", include("approvals.urls")),
    path("api/v1/", include("bridge.urls")),
    path("api/v1/", include("compliance.urls")),
    path("api/v1/", include("dex.urls")),
    path("api/v1/", include("governance.urls")),
    path("api/v1/", include("pki.urls")),
    path("api/v1/", include("operations.urls")),
    path("", include("oauth.urls")),  # OAuth for MCP clients: discovery, authorize, token, register, revoke
    path("healthz", views.healthz),
    path("readyz", views.readyz),
    path("metrics", views.metrics),
]

handler404 = "yuzu.api.handlers.not_found"
handler500 = "yuzu.api.handlers.server_error"
handler400 = "yuzu.api.handlers.bad_request"
