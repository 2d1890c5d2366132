from django.contrib import admin
from django.utils import timezone

from yuzu.admin_rbac import AuditedAdmin
from yuzu.audit import audit

from .models import (
    Agent,
    AgentExecStatus,
    AgentInventory,
    DeviceToken,
    Execution,
    InstructionDefinition,
    ManagementGroup,
    Response,
    Tag,
)


class TagInline(admin.TabularInline):
    model = Tag
    extra = 0


@admin.register(Agent)
class AgentAdmin(AuditedAdmin):
    list_display = ("agent_id", "hostname", "os", "arch", "agent_version", "connected", "last_seen", "quarantined")
    list_filter = ("connected", "os", "quarantined", "simulated")
    search_fields = ("agent_id", "hostname")
    readonly_fields = ("credential_hash",)
    inlines = [TagInline]


@admin.register(ManagementGroup)
class ManagementGroupAdmin(AuditedAdmin):
    list_display = ("name", "membership_type", "parent", "created_by", "updated_at")
    filter_horizontal = ("members",)


@admin.register(DeviceToken)
class DeviceTokenAdmin(AuditedAdmin):
    list_display = ("name", "created_by", "created_at", "expires_at", "revoked_at", "uses", "max_uses")
    readonly_fields = ("token_hash", "uses", "revoked_at")  # a revocation is for good: no clearing it here
    actions = ["revoke"]

    def has_add_permission(self, request):  # minted with `manage.py mint_device_token`, shown once
        return False

    @admin.action(description="Revoke selected device tokens")
    def revoke(self, request, queryset):
        n = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        audit(request.user, "device_token.revoke", "success", target_type="DeviceToken", detail=f"count={n}")


@admin.register(Execution)
class ExecutionAdmin(AuditedAdmin):
    list_display = ("id", "plugin", "action", "status", "dispatched_by", "dispatched_at", "agents_targeted",
                    "agents_responded", "agents_failure")
    list_filter = ("status",)


admin.site.register([Tag, AgentInventory, InstructionDefinition, AgentExecStatus, Response], AuditedAdmin)
