from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"

    def ready(self):
        from mcp.pipeline import set_approval_gate

        from .gate import gate

        set_approval_gate(gate)
