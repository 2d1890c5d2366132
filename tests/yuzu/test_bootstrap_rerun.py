"""Re-running bootstrap (every `make run` does) creates nothing and says how to mint a new MCP token for the AI
client's identity — the command docs/approvals.md and docs/running.md promise, which then works as printed."""

import io
import shlex

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from yuzu.models import ApiToken

pytestmark = pytest.mark.django_db


def test_a_second_run_prints_a_mint_token_line_that_works():
    call_command("bootstrap", "--no-qr", "--url", "http://127.0.0.1:8795", stdout=io.StringIO())
    users, tokens = get_user_model().objects.count(), ApiToken.objects.count()

    out = io.StringIO()
    call_command("bootstrap", "--no-qr", "--url", "http://127.0.0.1:8795", stdout=out)
    text = out.getvalue()
    assert (get_user_model().objects.count(), ApiToken.objects.count()) == (users, tokens)  # nothing created
    assert "already set up; nothing to do" in text
    assert "Mint a new one for the AI client's identity 'claude'" in text  # named as the first run names it
    assert "http://127.0.0.1:8795/admin/yuzu/apitoken/" in text

    line = next(ln for ln in text.splitlines() if "manage.py mint_token" in ln)
    argv = shlex.split(line)
    args = argv[argv.index("mint_token") + 1:]
    assert args[:6] == ["--user", "claude", "--role", "Operator", "--tier", "supervised"]  # as the docs quote it
    minted = io.StringIO()
    call_command("mint_token", *args, stdout=minted)
    new = ApiToken.objects.get(name="MCP (supervised)")
    assert new.owner.username == "claude" and new.mcp_tier == "supervised"
    assert minted.getvalue().strip().startswith("yuzu_")
