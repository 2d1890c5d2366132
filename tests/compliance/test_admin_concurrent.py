"""Two edits of one guard rule on its admin page at once, both from the page as it showed version 1
(tests/support/races.at_once, each request on its own thread and connection): the service makes each under the
rule's row lock and refuses the one whose version moved under it, so neither undoes the other's change and no
version is shared. Django's save() wrote every column as the page had read it: on PostgreSQL the second save put
the first one's change back and both edits ended at version 2."""

from functools import partial

import pytest

from compliance.models import GuardRule
from tests.compliance.test_admin import SPEC, rule_form
from tests.support.browser import staff_client
from tests.support.races import at_once
from yuzu.models import AuditEvent

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_edits_of_one_rule_at_once_one_is_saved_the_other_refused_with_nothing_undone(make_user):
    pete, paul = (staff_client(make_user, name, "PlatformEngineer") for name in ("pete", "paul"))
    rule = GuardRule.objects.create(name="passwd", spec_json=SPEC)
    url = f"/admin/compliance/guardrule/{rule.pk}/change/"
    data = rule_form(rule)
    without_enabled = {k: v for k, v in data.items() if k != "enabled"}
    answers = at_once(partial(pete.post, url, {**data, "severity": "high"}), partial(paul.post, url, without_enabled))
    assert sorted(r.status_code for _, r in answers) == [200, 302], answers
    refused = next(r for _, r in answers if r.status_code == 200)
    assert "was changed (it is at version 2, your edit started from version 1)" in refused.content.decode()
    rule.refresh_from_db()
    saved = next(client for client, (_, r) in zip((pete, paul), answers, strict=True) if r.status_code == 302)
    assert (rule.severity, rule.enabled, rule.version) == (("high", True, 2) if saved is pete else ("medium", False, 2))
    details = AuditEvent.objects.filter(action="guaranteed_state.rule.update").values_list("detail", flat=True)
    assert list(details) == ["name=passwd version=2"]
