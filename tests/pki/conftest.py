import time

import pytest
from django_otp.plugins.otp_totp.models import TOTPDevice

from tests.support.approvals import PASSWORD
from yuzu.rbac import Principal


@pytest.fixture
def approver(make_user):
    """ann: an Administrator (staff) with a TOTP device, as a session principal with a fresh proof."""
    user = make_user("ann", "Administrator", password=PASSWORD)
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    return Principal(user=user, via="session", mfa_verified_at=time.time())
