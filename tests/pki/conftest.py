
import pytest

from tests.support.approvals import approver_principal


@pytest.fixture
def approver(make_user):
    """ann: an Administrator (staff) with a TOTP device, as a session principal with a fresh proof."""
    return approver_principal(make_user, "ann", "Administrator")