"""Bridge admin: profiles are edited here (their env is visible only to administrators in this admin,
never through a tool); members, turns, messages and inbox items are records (RecordAdmin): shown, not added or
edited, and a delete — deleting a user deletes the workers it spawned, with their turns and messages — audited."""

from django import forms
from django.contrib import admin

from yuzu.admin_rbac import AuditedAdmin, RecordAdmin

from .models import InboxItem, Member, Message, Profile, Turn, _validate_env


class ProfileForm(forms.ModelForm):
    """``env`` is stored sealed (Profile.env_sealed): the form edits the plaintext object, the model seals it."""

    env = forms.JSONField(required=False, initial=dict, help_text=Profile.env.__doc__)

    class Meta:
        model = Profile
        exclude = ("env_sealed",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.initial["env"] = self.instance.env

    def clean_env(self):
        env = self.cleaned_data.get("env") or {}
        _validate_env(env)
        return env

    def save(self, commit=True):
        self.instance.env = self.cleaned_data.get("env") or {}
        return super().save(commit)


@admin.register(Profile)
class ProfileAdmin(AuditedAdmin):
    form = ProfileForm
    list_display = ("name", "agent_kind", "run_as", "is_default", "enabled", "blocked_injectable",
                    "requires_api_base_url", "spawnable")
    list_filter = ("agent_kind", "enabled")
    search_fields = ("name", "description")

    @admin.display(boolean=True, description="spawnable now")
    def spawnable(self, obj):
        return obj.spawnable


@admin.register(Member)
class MemberAdmin(RecordAdmin):
    list_display = ("session_id", "name", "profile_name", "pane_id", "status", "status_since", "owner", "stopped_at")
    list_filter = ("status", "profile_name")
    search_fields = ("session_id", "pane_id", "name")
    exclude = ("token",)

    def has_delete_permission(self, request, obj=None):
        """Not a live worker's: its row is how the bridge polls, reaps and stops its pane, so deleting it left the
        pane running on a live token that nothing would stop (bridge_stop it first). Nor, so, its user's."""
        return super().has_delete_permission(request, obj) and (obj is None or obj.stopped_at is not None)


@admin.register(Turn)
class TurnAdmin(RecordAdmin):
    list_display = ("turn_id", "member", "state", "origin", "detached", "created_at", "closed_at")
    list_filter = ("state",)
    search_fields = ("turn_id",)


@admin.register(Message)
class MessageAdmin(RecordAdmin):
    list_display = ("id", "member", "turn", "state", "created_at", "delivered_at", "error")
    list_filter = ("state",)


@admin.register(InboxItem)
class InboxItemAdmin(RecordAdmin):
    list_display = ("item_id", "recipient_key", "kind", "created_at", "acked_at")
    list_filter = ("kind",)
