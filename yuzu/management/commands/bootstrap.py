"""Idempotent first-run set-up: two identities, so the first approval can complete.

- the human administrator (password shown once, TOTP enrolment as an otpauth:// URI and a terminal QR
  code), who signs in to the admin and approves;
- a service identity for the AI client (default ``claude``, Operator role, no password) with a supervised
  MCP token and a ready-to-paste ``claude mcp add`` line. Its gated calls wait for the administrator: the
  reviewer must differ from the submitter, so the token must not belong to the approver.

Re-running it changes nothing and says how to mint a new token for the service identity."""

import io
import os
import secrets
import sys
from argparse import ArgumentParser
from datetime import timedelta

import qrcode
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from yuzu.audit import audit
from yuzu.models import ApiToken, TOTPDevice
from yuzu.rbac import assign_role, seed_builtin_roles


class Command(BaseCommand):
    help = "Create the administrator and the AI client's identity with its MCP token, once (safe to re-run)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--url", default=None, help="base URL clients use (default http://YUZU_BIND)")
        parser.add_argument("--no-qr", action="store_true")

    def handle(self, *args: str, url: str | None, no_qr: bool, **opts: object) -> None:
        seed_builtin_roles()
        User = get_user_model()
        base = url or f"http://{settings.YUZU_BIND}"
        agent_user = os.environ.get("YUZU_AGENT_USER", "claude")
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write(
                "bootstrap: already set up; nothing to do.\n"
                f"  Lost the MCP token? Mint a new one for the AI client's identity '{agent_user}' (printed once):\n"
                f"    {sys.executable} manage.py mint_token --user {agent_user} --role Operator --tier supervised "
                f"--name 'MCP (supervised)'\n"
                f"  then revoke the old one in the admin ({base}/admin/yuzu/apitoken/).")
            return
        username = os.environ.get("YUZU_ADMIN_USER", "admin")
        if username == agent_user:
            raise CommandError("YUZU_ADMIN_USER and YUZU_AGENT_USER must differ: the approver cannot approve its "
                               "own requests")
        password = secrets.token_urlsafe(15)
        admin = User.objects.create_superuser(username=username, email="", password=password)
        assign_role(admin, "Administrator")
        device = TOTPDevice.objects.create(user=admin, name="bootstrap", confirmed=True)
        agent = User.objects.filter(username=agent_user).first() or User.objects.create_user(username=agent_user)
        agent.set_unusable_password()
        agent.save()
        assign_role(agent, "Operator")
        token, raw = ApiToken.mint(agent, "bootstrap MCP (supervised)", mcp_tier="supervised",
                                   expires_at=timezone.now() + timedelta(days=90))
        audit("system", "bootstrap", "success", target_type="User", target_id=username,
              detail=f"admin {username} created; service identity {agent_user} (Operator) with mcp token {token.id}")
        out = self.stdout.write
        out("=" * 72)
        out("yuzu bootstrap — shown ONCE, store these now.\n")
        out("1. You, the administrator and approver. Admin login:")
        out(f"     {base}/admin/")
        out(f"     username:  {username}")
        out(f"     password:  {password}")
        out(f"   Authenticator (scan in an authenticator app; the admin asks for its code):\n     {device.config_url}")
        if not no_qr:
            self._qr(device.config_url)
        out(f"\n2. The AI client's own identity: '{agent_user}' (Operator role, no password), with a supervised")
        out("   MCP token (expires in 90 days). Its risky calls wait for your approval in the admin")
        out(f"   ({base}/admin/approvals/approval/) — see docs/approvals.md.")
        out(f"     {raw}")
        out("\nConnect Claude Code:")
        out(f"  claude mcp add --transport http yuzu {base}/mcp/v1/ --header \"Authorization: Bearer {raw}\"")
        out("=" * 72)

    def _qr(self, data: str) -> None:
        try:
            qr = qrcode.QRCode(border=1)
            qr.add_data(data)
            buf = io.StringIO()
            qr.print_ascii(out=buf, invert=True)
            self.stdout.write(buf.getvalue())
        except Exception as exc:  # a terminal without the glyphs still has the URI above
            self.stdout.write(f"(QR code unavailable: {exc})")
