"""The CA in the admin: the issued certificates (read-only) and a Revoke action that needs a fresh
authenticator code (step-up), the same service function as the tool and the REST route."""

from django.contrib import admin, messages

from yuzu.admin_rbac import ReadOnlyAdmin, session_principal
from yuzu.errors import YuzuError
from yuzu.stepup import mfa_is_fresh

from . import services
from .models import IssuedCert


@admin.register(IssuedCert)
class IssuedCertAdmin(ReadOnlyAdmin):
    securable = "Security"
    list_display = ("serial_hex", "subject", "purpose", "status", "not_after", "issued_at", "issued_by", "revoked_at")
    list_filter = ("purpose", "status")
    search_fields = ("serial_hex", "subject", "agent_id", "signer_name")
    readonly_fields = [f.name for f in IssuedCert._meta.fields]
    actions = ["revoke_selected"]

    def get_actions(self, request):
        actions = super().get_actions(request)
        if not self.may(request, "Delete"):
            actions.pop("revoke_selected", None)
        return actions

    @admin.action(description="Revoke selected certificates (needs a fresh authenticator code)")
    def revoke_selected(self, request, queryset):
        principal = session_principal(request)
        if not mfa_is_fresh(principal):
            self.message_user(request, "Revoking needs a fresh authenticator code: open /admin/stepup/, enter "
                                       "the current code, then revoke again. Nothing was revoked.", messages.ERROR)
            return
        done = set()  # revoked with an agent's later certificate selected before them
        for row in queryset:
            if row.serial_hex in done:
                continue
            try:
                r = services.revoke_certificate(principal, row.serial_hex, "revoked in the admin")
            except YuzuError as exc:
                self.message_user(request, f"{row.serial_hex}: {exc.message}", messages.ERROR)
            else:
                done.update(r["also_revoked"])
                also = f" with the agent's earlier {', '.join(r['also_revoked'])}" if r["also_revoked"] else ""
                self.message_user(request, f"{r['serial_hex']} revoked{also} (CRL republished: {r['crl_republished']})")
