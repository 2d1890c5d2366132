from yuzu import rbac

from . import services
from .models import Approval


def pending_count(request):
    """The admin header shows how many approvals wait: those the user may review (a reviewer), or the
    user's own (anyone else)."""
    user = getattr(request, "user", None)
    if not (user and user.is_authenticated and user.is_staff and request.path.startswith("/admin")):
        return {}
    principal = rbac.Principal(user=user, via="session")
    if rbac.has_any(principal, "Approval", "Approve"):
        return {"yuzu_pending_approvals": services.pending_count(principal)}
    return {"yuzu_pending_approvals": Approval.objects.pending().filter(submitted_by=principal.name).count()}
