from django import forms
from django.contrib import admin, messages

from yuzu import rbac
from yuzu.admin_rbac import (
    AuditedAdmin,
    HiddenColumnsAdmin,
    RecordAdmin,
    RevokeAction,
    ServiceForm,
    ServiceFormAdmin,
    session_principal,
)
from yuzu.errors import YuzuError
from yuzu.middleware import request_cid
from yuzu.stepup import mfa_is_fresh

from . import services
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
    """An agent's tags, shown: they are set and deleted on the Tags page, through fleet.services."""

    model = Tag
    extra = 0
    fields = readonly_fields = ("key", "value", "origin")
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class TagForm(ServiceForm):
    """set_tag, as over REST and MCP: the key and value checked and normalised (a ``service`` tag decides what a
    service-scoped token reaches), the agent sent its new tags, the audit row written."""

    class Meta:
        model = Tag
        fields = ["agent", "key", "value"]

    def write(self, principal, data):
        agent = data["agent"] if "agent" in data else self.instance.agent  # agent and key: read-only on a change
        tag = services.set_tag(principal, agent.pk, data.get("key", self.instance.key), data["value"])
        return Tag.objects.get(agent_id=tag["agent_id"], key=tag["key"]).pk


@admin.register(Tag)
class TagAdmin(ServiceFormAdmin, HiddenColumnsAdmin):
    """Tags set (TagForm) and deleted (one by one) through fleet.services, which audits and pushes them."""

    form = TagForm
    list_display = ("agent", "key", "value", "origin")  # origin: server (set here, wins) or agent (reported)
    list_filter = ("origin", "key")
    search_fields = ("agent__agent_id", "key", "value")

    def get_readonly_fields(self, request, obj=None):
        return ("agent", "key") if obj is not None else ()

    def delete_model(self, request, obj):
        try:
            services.delete_tag(session_principal(request), obj.agent_id, obj.key)
        except YuzuError as exc:
            self.message_user(request, f"{obj.key}: {exc.message}", messages.ERROR)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)


@admin.register(Agent)
class AgentAdmin(AuditedAdmin):
    """What an agent reports (its OS, hostname, attributes …) is shown, not edited: scope expressions match on it,
    so a dynamic group's members — and what a role on that group reaches — would change with a form. Agents are
    enrolled, not added here; deleting one cuts it off; the quarantine flag stays editable (docs/fleet.md)."""

    list_display = ("agent_id", "hostname", "os", "arch", "agent_version", "connected", "last_seen", "quarantined")
    list_filter = ("connected", "os", "quarantined", "simulated")
    search_fields = ("agent_id", "hostname")
    readonly_fields = ("agent_id", "hostname", "os", "arch", "agent_version", "connected", "last_seen", "enrolled_at",
                       "attributes", "simulated", "credential_hash")
    inlines = [TagInline]
    actions = ["revoke_credential"]

    def has_add_permission(self, request):
        return False

    def get_actions(self, request):
        actions = super().get_actions(request)
        if not rbac.may(session_principal(request), "Security", "Delete"):  # as the tool: fleet-wide
            actions.pop("revoke_credential", None)
        return actions

    @admin.action(description="Revoke the selected agents' credentials (needs a fresh authenticator code)")
    def revoke_credential(self, request, queryset):
        """fleet.services.revoke_agent_credential, as the tool and the REST route: each agent's live connection
        closes, its certificates are revoked, it enrols again with a new device token. A fresh authenticator code
        first, as revoking a certificate in the admin (pki.admin)."""
        principal = session_principal(request)
        if not mfa_is_fresh(principal):
            self.message_user(request, "Revoking needs a fresh authenticator code: open /admin/stepup/, enter the "
                                       "current code, then revoke again. Nothing was revoked.", messages.ERROR)
            return
        cid = request_cid(request)
        for agent_id in queryset.values_list("pk", flat=True):
            try:
                out = services.revoke_agent_credential(principal, agent_id, "revoked in the admin", cid=cid)
            except YuzuError as exc:
                self.message_user(request, f"{agent_id}: {exc.message}", messages.ERROR)
            else:
                certs = out["certificates_revoked"]
                self.message_user(request, f"{agent_id}: credential revoked"
                                  + (f", and its certificate(s) {', '.join(certs)}" if certs else "")
                                  + "; it must enrol again")


class GroupForm(ServiceForm):
    """A group is created and changed by fleet.services, as over REST and MCP: a parent that is the group itself or
    one of its descendants, a name another group has, a scope expression that does not parse are the form's errors
    (checked again under the row locks as it writes); members are added and removed one by one, audited."""

    service_fields = {"parent_id": "parent", "group": "members"}
    # When the page showed the group: one changed since (another tab, REST, MCP) is refused, not overwritten with
    # the values this page showed (Django compares the post with the row as it is now, not as it was shown).
    seen_updated_at = forms.DateTimeField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = ManagementGroup
        fields = ["name", "description", "parent", "membership_type", "scope_expression", "members"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["seen_updated_at"].initial = self.instance.updated_at

    def write(self, principal, data):
        parent = data.get("parent")
        fields = {"name": data["name"], "description": data["description"], "parent_id": parent.pk if parent else "",
                  "membership_type": data["membership_type"], "scope_expression": data["scope_expression"]}
        if self.instance._state.adding:
            before = set()
            group_id = services.create_group(principal, **{**fields, "parent_id": fields["parent_id"] or None})["id"]
        else:
            before = set(self.instance.members.values_list("pk", flat=True))
            group_id = self.instance.pk
            changed = {k: v for k, v in fields.items() if self.service_fields.get(k, k) in self.changed_data}
            if changed:
                services.update_group(principal, group_id, unchanged_since=data["seen_updated_at"], **changed)
        after = {agent.pk for agent in data.get("members") or ()}
        for agent_id in sorted(after - before):
            services.add_group_member(principal, group_id, agent_id)
        for agent_id in sorted(before - after):
            services.remove_group_member(principal, group_id, agent_id)
        return group_id


@admin.register(ManagementGroup)
class ManagementGroupAdmin(ServiceFormAdmin, HiddenColumnsAdmin):
    """Every write through fleet.services (GroupForm; deletes one group at a time), which audits it."""

    form = GroupForm
    list_display = ("name", "membership_type", "parent", "created_by", "updated_at")
    filter_horizontal = ("members",)

    def delete_model(self, request, obj):
        try:
            services.delete_group(session_principal(request), obj.pk)
        except YuzuError as exc:
            self.message_user(request, f"{obj}: {exc.message}", messages.ERROR)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)


@admin.register(DeviceToken)
class DeviceTokenAdmin(RevokeAction, HiddenColumnsAdmin):
    """Shown, and revoked (fleet.services.revoke_device_token, audited token by token); never edited or deleted. A
    token's expiry and uses are what it was minted with (``manage.py mint_device_token``): a form that moved the
    expiry of a token that had leaked, or raised its uses, widened who may enrol with no record of it. Mint a new
    token instead; a revoked one stays, the record of what enrolled the agents it let in."""

    list_display = ("name", "created_by", "created_at", "expires_at", "revoked_at", "uses", "max_uses")
    fields = readonly_fields = ("id", "name", "created_by", "created_at", "expires_at", "max_uses", "uses",
                                "revoked_at")
    exclude = ("token_hash",)
    actions = ["revoke"]

    def has_add_permission(self, request):  # minted with `manage.py mint_device_token`, shown once
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Revoke selected device tokens", permissions=["revoke"])
    def revoke(self, request, queryset):
        principal, cid = session_principal(request), request_cid(request)
        revoked = sum(services.revoke_device_token(principal, pk, cid=cid)["revoked"]
                      for pk in queryset.values_list("pk", flat=True))
        self.message_user(request, f"Revoked {revoked} device token{'s' if revoked != 1 else ''}.")


@admin.register(Execution)
class ExecutionAdmin(RecordAdmin):
    list_display = ("id", "plugin", "action", "status", "dispatched_by", "dispatched_at", "agents_targeted",
                    "agents_responded", "agents_failure")
    list_filter = ("status",)


admin.site.register([AgentInventory, AgentExecStatus, Response], RecordAdmin)
admin.site.register(InstructionDefinition, AuditedAdmin)
