"""Bridge admin: profiles are edited here (their env is visible only to administrators in this admin,
never through a tool); members, turns, messages and inbox items are read-only records."""

from django.contrib import admin

from .models import InboxItem, Member, Message, Profile, Turn


@admin.register(Profile)
class ProfileAdmin(admin.ModelAdmin):
    list_display = ("name", "agent_kind", "is_default", "enabled", "blocked_injectable", "requires_api_base_url",
                    "spawnable")
    list_filter = ("agent_kind", "enabled")
    search_fields = ("name", "description")

    @admin.display(boolean=True, description="spawnable now")
    def spawnable(self, obj):
        return obj.spawnable


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Member)
class MemberAdmin(ReadOnly):
    list_display = ("session_id", "name", "profile_name", "pane_id", "status", "status_since", "owner", "stopped_at")
    list_filter = ("status", "profile_name")
    search_fields = ("session_id", "pane_id", "name")
    exclude = ("token",)


@admin.register(Turn)
class TurnAdmin(ReadOnly):
    list_display = ("turn_id", "member", "state", "origin", "detached", "created_at", "closed_at")
    list_filter = ("state",)
    search_fields = ("turn_id",)


@admin.register(Message)
class MessageAdmin(ReadOnly):
    list_display = ("id", "member", "turn", "state", "created_at", "delivered_at", "error")
    list_filter = ("state",)


@admin.register(InboxItem)
class InboxItemAdmin(ReadOnly):
    list_display = ("item_id", "recipient_key", "kind", "created_at", "acked_at")
    list_filter = ("kind",)
