"""The compliance admin: fragments, policies and guard rules edited as their YAML / spec by staff whose RBAC
allows it (Policy:* and GuaranteedState:*), verdicts and drift events browsable (read-only), and each
policy's page showing its compliance (counts and the percentage of its evaluated agents that comply)."""

from django import forms
from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html

from yuzu.admin_rbac import RbacAdmin, ServiceForm, ServiceFormAdmin, session_principal
from yuzu.errors import YuzuError

from . import services
from .models import GuardianEvent, GuardRule, Policy, PolicyAgentStatus, PolicyFragment


class ServiceDeleteAdmin(RbacAdmin):
    """Deletes — one row, or the changelist's "Delete selected" (Django's bulk delete is one queryset.delete(),
    which skipped delete_model and so the audit row and the fleet cache) — go through the service's delete, one
    row at a time: its audit row, its side effects."""

    def service_delete(self, principal, obj):
        raise NotImplementedError

    def delete_model(self, request, obj):
        try:
            self.service_delete(session_principal(request), obj)
        except YuzuError as exc:
            self.message_user(request, f"{obj}: {exc.message}", messages.ERROR)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)


class ReadOnlyAdmin(RbacAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]


class YamlForm(ServiceForm):
    """The YAML is the only input: the service checks it, derives every other column from it and writes, as the
    REST routes' do; a refusal is the YAML field's error (with its line and column), nothing written."""

    refusal_field = "yaml_source"
    yaml_source = forms.CharField(label="YAML", widget=forms.Textarea(attrs={
        "rows": 20, "cols": 100, "class": "vLargeTextField", "spellcheck": "false", "wrap": "off",
        "style": "font-family: monospace"}),
                                  help_text="apiVersion: yuzu.io/v1alpha1 — see docs/compliance.md")

    def clean_yaml_source(self):
        return self.cleaned_data["yaml_source"].replace("\r\n", "\n")

    def describe(self, exc):
        where = f" (line {exc.extra['line']}, column {exc.extra.get('column')})" if "line" in exc.extra else ""
        return exc.message + where


class FragmentForm(YamlForm):
    class Meta:
        model = PolicyFragment
        fields = ["yaml_source"]

    def write(self, principal, data):
        if self.instance._state.adding:
            return services.create_fragment(principal, data["yaml_source"])["id"]
        return services.update_fragment(principal, self.instance.pk, data["yaml_source"])["id"]


class PolicyForm(YamlForm):
    class Meta:
        model = Policy
        fields = ["yaml_source"]

    def write(self, principal, data):
        if self.instance._state.adding:
            return services.create_policy(principal, data["yaml_source"])["id"]
        return services.update_policy(principal, self.instance.pk, data["yaml_source"])["id"]


@admin.register(PolicyFragment)
class PolicyFragmentAdmin(ServiceFormAdmin, ServiceDeleteAdmin):
    securable = "Policy"
    form = FragmentForm
    list_display = ("name", "check_instruction", "fix_instruction", "updated_at")
    search_fields = ("name",)
    readonly_fields = ("check_instruction", "check_compliance", "fix_instruction", "post_check_instruction")

    def service_delete(self, principal, obj):
        services.delete_fragment(principal, obj.pk)


@admin.register(Policy)
class PolicyAdmin(ServiceFormAdmin, ServiceDeleteAdmin):
    securable = "Policy"
    form = PolicyForm
    list_display = ("name", "fragment", "enabled", "interval_seconds", "compliance_pct", "last_dispatch_at")
    list_filter = ("enabled",)
    search_fields = ("name",)
    readonly_fields = ("compliance", "fragment", "enabled", "scope_expression", "interval_seconds",
                       "last_dispatch_at", "next_due_at")
    fields = ("compliance", "yaml_source", "fragment", "enabled", "scope_expression", "interval_seconds",
              "last_dispatch_at", "next_due_at")

    @admin.display(description="compliant")
    def compliance_pct(self, obj):
        s = obj.summary()
        return f"{100.0 * s['compliant'] / s['total']:.1f} % of {s['total']}" if s["total"] else "not evaluated"

    @admin.display(description="Compliance")
    def compliance(self, obj):
        if obj is None or obj.pk is None:
            return "—"
        s = obj.summary()
        pct = 100.0 * s["compliant"] / s["total"] if s["total"] else 0.0
        verdicts = reverse("admin:compliance_policyagentstatus_changelist") + f"?policy__id__exact={obj.pk}"
        return format_html(
            '<strong style="font-size:1.4em">{} %</strong> compliant of {} evaluated agent(s) — '
            "{} compliant, {} non-compliant, {} unknown, {} fixing, {} error. <a href=\"{}\">Verdicts per agent</a>",
            f"{pct:.1f}", s["total"], s["compliant"], s["non_compliant"], s["unknown"], s["fixing"], s["error"],
            verdicts)

    def service_delete(self, principal, obj):
        services.delete_policy(principal, obj.pk)


@admin.register(PolicyAgentStatus)
class VerdictAdmin(ReadOnlyAdmin):
    securable = "Policy"
    list_display = ("policy", "agent", "status", "last_check_at", "fix_attempts")
    list_filter = ("status", "policy")
    search_fields = ("agent__agent_id", "agent__hostname", "policy__name")


class GuardRuleForm(ServiceForm):
    """A rule is created and changed by compliance.services, as over REST and MCP: its spec and scope checked, and
    a change made under the rule's row lock, raising its version, with the service's audit row."""

    service_fields = {"spec": "spec_json"}
    spec_json = forms.JSONField(label="spec", widget=forms.Textarea(attrs={"rows": 16, "cols": 100}),
                                help_text="{spark, assertion, remediation}: see get_guardian_schemas")
    # The version the page showed: a rule changed since (another tab, REST, MCP) is refused, not overwritten with
    # the values this page showed (Django compares the post with the row as it is now, not as it was shown).
    seen_version = forms.IntegerField(widget=forms.HiddenInput)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["seen_version"].initial = self.instance.version

    class Meta:
        model = GuardRule
        fields = ["name", "spec_json", "enabled", "enforcement_mode", "severity", "os_target", "scope_expr"]

    def write(self, principal, data):
        values = {("spec" if f == "spec_json" else f): data[f] for f in self.Meta.fields}
        if self.instance._state.adding:
            return services.create_rule(principal, values)["rule_id"]
        changed = {k: v for k, v in values.items() if self.service_fields.get(k, k) in self.changed_data}
        if not changed:
            return self.instance.pk
        return services.update_rule(principal, self.instance.pk, changed, version=data["seen_version"])["rule_id"]


@admin.register(GuardRule)
class GuardRuleAdmin(ServiceFormAdmin, ServiceDeleteAdmin):
    securable = "GuaranteedState"
    form = GuardRuleForm
    list_display = ("name", "assertion", "enforcement_mode", "severity", "os_target", "enabled", "version")
    list_filter = ("enabled", "enforcement_mode", "severity")

    @admin.display(description="assertion")
    def assertion(self, obj):
        return (obj.spec_json.get("assertion") or {}).get("type", "")

    def service_delete(self, principal, obj):
        services.delete_rule(principal, obj.pk)


@admin.register(GuardianEvent)
class GuardianEventAdmin(ReadOnlyAdmin):
    securable = "GuaranteedState"
    list_display = ("timestamp", "event_type", "rule_name", "agent", "severity", "detected_value", "expected_value")
    list_filter = ("event_type", "severity", "guard_category")
    search_fields = ("agent__agent_id", "rule_name")
