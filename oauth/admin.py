"""The admin's view of OAuth: the registered clients and every connection (consent) with its access token.
Both are read-only; what can be done is revoke — a client (every connection it has, and it cannot register again
under that client ID) or single connections. django-oauth-toolkit's own token and grant pages are not shown: the
access token of a connection is an API token (Yuzu › API tokens), refresh tokens and codes are internal."""

from django.contrib import admin, messages
from django.utils import timezone
from oauth2_provider.models import (
    get_access_token_model,
    get_application_model,
    get_grant_model,
    get_id_token_model,
    get_refresh_token_model,
)

from yuzu.admin_rbac import RevokeAction
from yuzu.audit import audit

from .models import Authorization, ClientState

Application = get_application_model()

for model in (Application, get_access_token_model(), get_grant_model(), get_id_token_model(),
              get_refresh_token_model()):
    if admin.site.is_registered(model):
        admin.site.unregister(model)


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class AuthorizationInline(admin.TabularInline):
    model = Authorization
    fields = ("user", "mcp_tier", "audience", "created_at", "expires_at", "revoked_at", "revoked_reason", "api_token")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Application)
class ClientAdmin(RevokeAction, ReadOnly):
    list_display = ("display_name", "client_id", "registration_source", "created", "live_connections", "status")
    list_filter = ("registration_source",)
    search_fields = ("name", "client_id")
    fields = ("name", "client_id", "registration_source", "client_type", "redirect_uris", "created", "updated",
              "cimd_expires_at", "status")
    readonly_fields = fields
    inlines = [AuthorizationInline]
    actions = ["revoke"]

    @admin.display(description="name")
    def display_name(self, obj):
        return obj.name or "(unnamed)"

    @admin.display(description="live connections")
    def live_connections(self, obj):
        return obj.yuzu_authorizations.filter(revoked_at__isnull=True, expires_at__gt=timezone.now()).count()

    @admin.display(description="status")
    def status(self, obj):
        state = ClientState.objects.filter(application=obj, revoked_at__isnull=False).first()
        return f"revoked {state.revoked_at:%Y-%m-%d %H:%M} by {state.revoked_by}" if state else "active"

    @admin.action(description="Revoke selected clients (and every connection they hold)", permissions=["revoke"])
    def revoke(self, request, queryset):
        for app in queryset:
            ClientState.objects.update_or_create(application=app, defaults={
                "revoked_at": timezone.now(), "revoked_by": request.user.get_username()})
            ended = sum(auth.revoke("client revoked", by=request.user)
                        for auth in app.yuzu_authorizations.filter(revoked_at__isnull=True))
            audit(request.user, "oauth.client.revoke", "success", target_type="OAuthClient",
                  target_id=app.client_id[:256], detail=f"name={app.name!r} connections_revoked={ended}")
        messages.success(request, f"Revoked {queryset.count()} client(s): their tokens stopped working, and they cannot "
                                  "connect again.")


@admin.register(Authorization)
class AuthorizationAdmin(RevokeAction, ReadOnly):
    list_display = ("user", "application", "mcp_tier", "audience", "created_at", "expires_at", "api_token",
                    "revoked_at", "revoked_reason")
    list_filter = ("mcp_tier", "audience", "revoked_reason")
    search_fields = ("user__username", "application__name", "application__client_id")
    fields = ("id", "user", "application", "audience", "resource", "mcp_tier", "created_at", "expires_at",
              "api_token", "revoked_at", "revoked_reason")
    readonly_fields = fields
    actions = ["revoke"]

    @admin.action(description="Revoke selected connections", permissions=["revoke"])
    def revoke(self, request, queryset):
        ended = sum(auth.revoke("revoked in the admin", by=request.user)
                    for auth in queryset.filter(revoked_at__isnull=True))
        messages.success(request, f"Revoked {ended} connection(s): their tokens stopped working.")
