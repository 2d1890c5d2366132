
import pytest

from tests.support.approvals import approver_principal
from yuzu.models import Role, RolePermission


@pytest.fixture
def approver(make_user):
    """ann: an Administrator (staff) with a TOTP device, as a session principal with a fresh proof."""
    return approver_principal(make_user, "ann", "Administrator")


@pytest.fixture
def fleet_reader(db):
    """A custom role with Infrastructure:Read only: an engine principal's narrow authority."""
    role, _ = Role.objects.get_or_create(name="FleetReader", defaults={"description": "reads agents"})
    RolePermission.objects.get_or_create(role=role, securable="Infrastructure", operation="Read")
    return role
