"""The operator surface in the admin, each page gated by its securable (yuzu.admin_rbac) and every change made
through the same service function as the MCP tool and the REST route (validation, audit, push to agents):
plugin configuration, write-only plugin secrets (the value is typed in, never shown), kill switches,
instruction schedules; upload grants and the uploaded files with their hashes, the software inventory and the
detected licences, read-only."""

from django import forms
from django.contrib import admin, messages

from yuzu.admin_rbac import RbacAdmin, ReadOnlyAdmin, session_principal
from yuzu.errors import YuzuError

from . import plugins, schedules
from .models import (
    DetectedLicense,
    InstalledSoftware,
    InstructionSchedule,
    PluginConfig,
    PluginKillSwitch,
    PluginSecret,
    UploadGrant,
    UploadSession,
)


class ServiceForm(forms.ModelForm):
    """Validates with the service's own checks, so the admin refuses exactly what the tool refuses."""

    def service_check(self, data):
        raise NotImplementedError

    def clean(self):
        data = super().clean()
        if not self.errors:
            try:
                self.service_check(data)
            except YuzuError as exc:
                raise forms.ValidationError(exc.message) from None
        return data


class ServiceAdmin(RbacAdmin):
    """save_model and delete_model call the service (audit, push); the form has validated with it already."""

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        form.request = request  # the service's checks need the principal (RBAC on the row's scope)
        return form

    def message_error(self, request, exc):
        self.message_user(request, exc.message, messages.ERROR)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)


class PluginConfigForm(ServiceForm):
    class Meta:
        model = PluginConfig
        fields = ["plugin", "key", "value"]

    def service_check(self, data):
        # on a change, plugin and key are read-only (not in the form): the row's own
        plugin, key = data.get("plugin", self.instance.plugin), data.get("key", self.instance.key)
        plugins.check_plugin(plugin), plugins.check_key(key)
        plugins.check_value(plugin, key, data.get("value", ""))


@admin.register(PluginConfig)
class PluginConfigAdmin(ServiceAdmin):
    securable = "PluginConfig"
    form = PluginConfigForm
    list_display = ("plugin", "key", "value", "updated_by", "updated_at_ms")
    list_filter = ("plugin",)
    search_fields = ("plugin", "key")

    def get_readonly_fields(self, request, obj=None):
        """A value is changed in place; its plugin and key name the row (changing them in the form made a new
        row and left the old one set)."""
        return ("plugin", "key") if obj is not None else ()

    def save_model(self, request, obj, form, change):
        plugins.set_plugin_config(session_principal(request), obj.plugin, obj.key, obj.value, surface="rest")
        obj.pk = PluginConfig.objects.get(plugin=obj.plugin, key=obj.key).pk

    def delete_model(self, request, obj):
        plugins.delete_plugin_config(session_principal(request), obj.plugin, obj.key, surface="rest")


class PluginSecretForm(ServiceForm):
    value = forms.CharField(widget=forms.PasswordInput(render_value=False), max_length=65536,
                            help_text="Write-only: stored encrypted, never shown again.")

    class Meta:
        model = PluginSecret
        fields = ["plugin", "key"]

    def service_check(self, data):
        plugins.plan_set_plugin_secret(session_principal(self.request), data.get("plugin"), data.get("key"),
                                       data.get("value"))


@admin.register(PluginSecret)
class PluginSecretAdmin(ServiceAdmin):
    securable = "PluginSecret"
    form = PluginSecretForm
    list_display = ("scope_key", "updated_by", "updated_at_ms")
    search_fields = ("scope_key",)

    def get_readonly_fields(self, request, obj=None):
        return ("plugin", "key") if obj is not None else ()

    def save_model(self, request, obj, form, change):
        plugins.set_plugin_secret(session_principal(request), obj.plugin, obj.key, form.cleaned_data["value"],
                                  surface="rest")
        obj.scope_key = f"{obj.plugin}.{obj.key}"

    def delete_model(self, request, obj):
        plugins.delete_plugin_secret(session_principal(request), obj.plugin, obj.key, surface="rest")


class KillSwitchForm(ServiceForm):
    class Meta:
        model = PluginKillSwitch
        fields = ["plugin", "action", "group", "enabled", "reason"]

    def service_check(self, data):
        row = self.instance  # on a change, plugin, action and group are read-only: the row's own
        group = data.get("group", row.group)
        plugins.plan_set_plugin_kill_switch(session_principal(self.request), data.get("plugin", row.plugin),
                                            bool(data.get("enabled")), data.get("action", row.action) or "",
                                            data.get("reason") or "", group.pk if group else "")


@admin.register(PluginKillSwitch)
class PluginKillSwitchAdmin(ServiceAdmin):
    securable = "PluginConfig"
    form = KillSwitchForm
    list_display = ("switch", "applies_to", "enabled", "reason", "set_by", "updated_at_ms")
    list_filter = ("enabled", "group")
    list_select_related = ("group",)  # applies_to names the group: one query for the page, not one per row
    actions = ["switch_off", "switch_on"]

    @admin.display(description="applies to", ordering="group__name")
    def applies_to(self, obj):
        return obj.where

    def has_delete_permission(self, request, obj=None):
        return False  # a switch is turned back on, not deleted (its row is the record of who flipped it)

    def get_readonly_fields(self, request, obj=None):
        return ("plugin", "action", "group") if obj is not None else ()

    def save_model(self, request, obj, form, change):
        plugins.set_plugin_kill_switch(session_principal(request), obj.plugin, obj.enabled, obj.action or "",
                                       obj.reason or "", obj.group_id or "", surface="rest")
        obj.scope_key = PluginKillSwitch.key_of(obj.plugin, obj.action or "", obj.group_id or "")

    def _flip(self, request, queryset, enabled):
        flipped = 0
        for row in queryset:
            try:
                plugins.set_plugin_kill_switch(session_principal(request), row.plugin, enabled, row.action,
                                               row.reason if not enabled else "", row.group_id or "", surface="rest")
            except YuzuError as exc:
                self.message_error(request, exc)
            else:
                flipped += 1
        if flipped:  # only what changed: a refusal is its own message, never counted as done
            self.message_user(request, f"{flipped} switch(es) turned {'on' if enabled else 'off'}")

    # Offered only to those who may change switches (Django offers an action without permissions to every reader).
    @admin.action(description="Switch the selected plugins/actions OFF (refuse every dispatch)", permissions=["change"])
    def switch_off(self, request, queryset):
        self._flip(request, queryset, False)

    @admin.action(description="Switch the selected plugins/actions back ON", permissions=["change"])
    def switch_on(self, request, queryset):
        self._flip(request, queryset, True)


class ScheduleForm(ServiceForm):
    class Meta:
        model = InstructionSchedule
        fields = ["name", "definition_id", "parameters", "frequency_type", "interval_minutes", "time_of_day",
                  "time_zone", "day_of_week", "day_of_month", "start_at", "scope_expression", "requires_approval",
                  "enabled"]

    def service_check(self, data):
        # The service's RBAC too, before the save: refused there, the save raised out of the admin (a 500).
        schedules.check_may_create(session_principal(self.request))
        d = dict(data)
        d["start_at"] = data["start_at"].isoformat() if data.get("start_at") else None
        schedules.validate(d)


@admin.register(InstructionSchedule)
class InstructionScheduleAdmin(ServiceAdmin):
    securable = "Schedule"
    form = ScheduleForm
    list_display = ("id", "name", "definition_id", "frequency_type", "enabled", "approval_state",
                    "next_execution_at", "last_executed_at", "execution_count", "last_error")
    list_filter = ("enabled", "frequency_type", "approval_state")
    actions = ["enable", "disable"]

    def has_change_permission(self, request, obj=None):
        return False if obj is not None else super().has_change_permission(request, obj)

    def get_fields(self, request, obj=None):
        """An existing schedule is only viewed: its parameters as shown_parameters (secrets redacted)."""
        fields = list(super().get_fields(request, obj))
        return [("shown_parameters" if f == "parameters" else f) for f in fields] if obj is not None else fields

    def get_readonly_fields(self, request, obj=None):
        return ("shown_parameters",) if obj is not None else ()

    @admin.display(description="parameters")
    def shown_parameters(self, obj):
        return obj.shown_parameters()

    def save_model(self, request, obj, form, change):
        d = {f: form.cleaned_data.get(f) for f in ScheduleForm.Meta.fields}
        d["start_at"] = d["start_at"].isoformat() if d.get("start_at") else None
        created = schedules.create_schedule(session_principal(request), d)
        obj.pk = created["id"]

    def delete_model(self, request, obj):
        schedules.delete_schedule(session_principal(request), obj.pk)

    def _enable(self, request, queryset, enabled):
        for row in queryset:
            try:
                schedules.enable_schedule(session_principal(request), row.pk, enabled)
            except YuzuError as exc:  # a refusal is a message on the page, never a 500
                self.message_error(request, exc)

    # Offered only to those who may change schedules (a reader posting it anyway got the service's refusal as a 500).
    @admin.action(description="Enable the selected schedules", permissions=["change"])
    def enable(self, request, queryset):
        self._enable(request, queryset, True)

    @admin.action(description="Disable the selected schedules", permissions=["change"])
    def disable(self, request, queryset):
        self._enable(request, queryset, False)


@admin.register(UploadGrant)
class UploadGrantAdmin(ReadOnlyAdmin):
    securable = "UploadGrant"
    list_display = ("grant_id", "agent_id", "state", "declared_max_size", "retention_class", "minted_by",
                    "created_at", "expires_at")
    list_filter = ("state", "retention_class")
    exclude = ("secret_sha256",)


@admin.register(UploadSession)
class UploadSessionAdmin(ReadOnlyAdmin):
    securable = "UploadGrant"
    list_display = ("upload_id", "grant", "state", "actual_size", "sha256", "committed_at")
    list_filter = ("state",)
    exclude = ("session_sha256",)


@admin.register(InstalledSoftware)
class InstalledSoftwareAdmin(ReadOnlyAdmin):
    securable = "Inventory"
    list_display = ("agent_id", "name", "version", "publisher", "install_date", "source")
    list_filter = ("source",)
    search_fields = ("=name", "=agent__agent_id")


@admin.register(DetectedLicense)
class DetectedLicenseAdmin(ReadOnlyAdmin):
    securable = "SoftwareLicensing"
    list_display = ("agent_id", "product", "license_type", "state", "channel", "expiry_at", "detector", "confidence")
    list_filter = ("state", "license_type", "detector")
    search_fields = ("=product", "=agent__agent_id")
