"""Management-group writes at once over REST (tests/support/races.at_once, each request on its own thread and
connection): what the sequential calls refuse stays refused, and no edit undoes another."""

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


def test_two_reparentings_at_once_never_make_a_cycle(client_for):
    """Each checked that its new parent is not its own descendant, before the other wrote: x under y and y under
    x both committed, and every later re-parenting beneath them looped for ever in that check."""
    def parent(group, under):
        return client_for().put(f"/api/v1/management-groups/{group.pk}", {"parent_id": under.pk},
                                content_type="application/json")

    for n in range(10):
        x = ManagementGroup.objects.create(name=f"x{n}")
        y = ManagementGroup.objects.create(name=f"y{n}")
        answers = at_once(partial(parent, x, y), partial(parent, y, x))
        assert sorted(r.status_code for _, r in answers) == [200, 400], [r.content[:300] for _, r in answers]
        x.refresh_from_db(), y.refresh_from_db()
        assert (x.parent_id, y.parent_id) in ((y.pk, None), (None, x.pk))


def test_two_edits_of_different_fields_at_once_keep_both(client_for):
    """Each edit saved every column of the group as it had read it, putting back what the other had changed."""
    def edit(group, body):
        return client_for().put(f"/api/v1/management-groups/{group.pk}", body, content_type="application/json")

    for n in range(10):
        g = ManagementGroup.objects.create(name=f"g{n}")
        answers = at_once(partial(edit, g, {"name": f"renamed-{n}"}), partial(edit, g, {"description": "d"}))
        assert [r.status_code for _, r in answers] == [200, 200], [r.content[:300] for _, r in answers]
        g.refresh_from_db()
        assert (g.name, g.description) == (f"renamed-{n}", "d")
