import time

import pytest
from django_otp.plugins.otp_totp.models import TOTPDevice

from tests.support.approvals import PASSWORD
from yuzu.models import Role, RolePermission
from yuzu.rbac import Principal


@pytest.fixture
def approver(make_user):
    """ann: an Administrator (staff) with a TOTP device, as a session principal with a fresh proof."""
    user = make_user("ann", "Administrator", password=PASSWORD)
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    return Principal(user=user, via="session", mfa_verified_at=time.time())


@pytest.fixture
def fleet_reader(db):
    """A custom role with Infrastructure:Read only: an engine principal's narrow authority."""
    role, _ = Role.objects.get_or_create(name="FleetReader", defaults={"description": "reads agents"})
    RolePermission.objects.get_or_create(role=role, securable="Infrastructure", operation="Read")
    return role
