from django.apps import AppConfig
from django.db.models.signals import post_save


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"

    def ready(self):
        # deferred: apps.py is imported before any model can be, and these import models
        from mcp.pipeline import set_approval_gate

        from .gate import gate
        from .notify import on_approval_saved

        set_approval_gate(gate)
        # A new ticket tells the approvers (email, webhook) once its transaction commits.
        post_save.connect(on_approval_saved, sender=self.get_model("Approval"), dispatch_uid="approvals.notify")
