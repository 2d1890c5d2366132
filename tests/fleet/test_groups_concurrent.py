"""Management-group writes at once over REST (tests/support/races.at_once, each request on its own thread and
connection): what the sequential calls refuse stays refused."""

from functools import partial

import pytest
from django.test import Client

from fleet.models import ManagementGroup
from tests.support.races import at_once
from yuzu.models import AuditEvent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client_for(mint):
    raw = mint("root", role="Administrator")
    return lambda: Client(HTTP_AUTHORIZATION=f"Bearer {raw}", raise_request_exception=False)


def test_two_creates_of_one_name_at_once_make_one_group_and_refuse_the_other(client_for):
    def create(name):
        return client_for().post("/api/v1/management-groups", {"name": name}, content_type="application/json")

    for n in range(10):
        answers = at_once(partial(create, f"web-{n}"), partial(create, f"web-{n}"))
        assert sorted(r.status_code for _, r in answers) == [201, 400], [r.content[:300] for _, r in answers]
        assert "already exists" in next(r for _, r in answers if r.status_code == 400).json()["error"]["message"]
    assert ManagementGroup.objects.count() == 10
    assert AuditEvent.objects.filter(action="management_group.create").count() == 10
