def pending_count(request):
    """The admin shows how many approvals wait for a reviewer."""
    user = getattr(request, "user", None)
    if not (user and user.is_authenticated and user.is_staff and request.path.startswith("/admin")):
        return {}
    from .models import Approval

    return {"yuzu_pending_approvals": Approval.objects.filter(status=Approval.PENDING).count()}
