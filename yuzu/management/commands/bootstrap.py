"""Idempotent first-run set-up: the first admin (password shown once, TOTP enrolment as an
otpauth:// URI and a terminal QR code) and a supervised MCP token with a ready-to-paste
`claude mcp add` line."""

import os
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.utils import timezone
from django_otp.plugins.otp_totp.models import TOTPDevice

from yuzu.audit import audit
from yuzu.models import ApiToken
from yuzu.rbac import assign_role, seed_builtin_roles


class Command(BaseCommand):
    help = "Create the first admin and a supervised MCP token if there are none (safe to re-run)."

    def add_arguments(self, parser):
        parser.add_argument("--url", default=None, help="base URL clients use (default http://YUZU_BIND)")
        parser.add_argument("--no-qr", action="store_true")

    def handle(self, *args, url, no_qr, **opts):
        seed_builtin_roles()
        User = get_user_model()
        base = url or f"http://{settings.YUZU_BIND}"
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write("bootstrap: an administrator already exists; nothing to do.")
            return
        username = os.environ.get("YUZU_ADMIN_USER", "admin")
        password = secrets.token_urlsafe(15)
        admin = User.objects.create_superuser(username=username, email="", password=password)
        assign_role(admin, "Administrator")
        device = TOTPDevice.objects.create(user=admin, name="bootstrap", confirmed=True)
        token, raw = ApiToken.mint(admin, "bootstrap MCP (supervised)", mcp_tier="supervised",
                                   expires_at=timezone.now() + timedelta(days=90))
        audit("system", "bootstrap", "success", target_type="User", target_id=username,
              detail=f"admin created; mcp token {token.id}")
        out = self.stdout.write
        out("=" * 72)
        out("yuzu bootstrap — shown ONCE, store these now.\n")
        out(f"Admin login:   {base}/admin/")
        out(f"  username:    {username}")
        out(f"  password:    {password}")
        out(f"TOTP enrolment (scan in an authenticator app):\n  {device.config_url}")
        if not no_qr:
            self._qr(device.config_url)
        out(f"\nSupervised MCP token (expires in 90 days):\n  {raw}")
        out("\nConnect Claude Code:")
        out(f"  claude mcp add --transport http yuzu {base}/mcp/v1/ --header \"Authorization: Bearer {raw}\"")
        out("=" * 72)

    def _qr(self, data):
        try:
            import io

            import qrcode

            qr = qrcode.QRCode(border=1)
            qr.add_data(data)
            buf = io.StringIO()
            qr.print_ascii(out=buf, invert=True)
            self.stdout.write(buf.getvalue())
        except Exception as exc:  # a terminal without the glyphs still has the URI above
            self.stdout.write(f"(QR code unavailable: {exc})")
