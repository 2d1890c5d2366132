"""``manage.py mint_token`` goes through ApiToken.mint, so its token names obey the one rule for labels an
approver or a token list shows (yuzu.text.check_label): a name hiding or reordering text is refused and nothing
is created."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from yuzu.models import ApiToken, AuditEvent

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("name", ["weekly\u202etroper", "bell\x07", "", "x" * 257])
def test_a_bad_name_is_refused_and_nothing_is_minted(name, capsys):
    with pytest.raises(CommandError, match="name"):
        call_command("mint_token", "--user", "ops", "--name", name, "--role", "Viewer")
    assert not ApiToken.objects.exists() and not AuditEvent.objects.filter(action="api_token.create").exists()
    assert not get_user_model().objects.filter(username="ops").exists()
    assert "yuzu_" not in capsys.readouterr().out


def test_a_plain_name_mints_a_token_printed_once(capsys):
    call_command("mint_token", "--user", "ops", "--name", "nightly report", "--role", "Viewer")
    raw = capsys.readouterr().out.strip()
    token = ApiToken.objects.get()
    assert raw.startswith("yuzu_") and token.name == "nightly report" and token.prefix == raw[:12]
