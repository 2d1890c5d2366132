from argparse import ArgumentParser
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from yuzu.audit import audit
from yuzu.models import MCP_TIERS, MCP_TOKEN_MAX_DAYS, ApiToken, Role
from yuzu.rbac import assign_role
from yuzu.text import check_label


class Command(BaseCommand):
    help = "Mint an API token and print it once. With --role, creates the user with that role if missing."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--user", required=True)
        parser.add_argument("--name", required=True)
        parser.add_argument("--role", help="built-in role for a user created by this command")
        parser.add_argument("--tier", choices=MCP_TIERS, default="", help="MCP tier (expiry capped at 90 days)")
        parser.add_argument("--expires-days", type=int)
        parser.add_argument("--service", default="", help="scope_service")

    def handle(self, *args: str, user: str, name: str, role: str | None, tier: str, expires_days: int | None,
               service: str, **opts: object) -> None:
        try:  # before the user is created: a refused name leaves nothing behind
            check_label("name", name, ApiToken.NAME_LENGTH)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        User = get_user_model()
        account = User.objects.filter(username=user).first()
        if account is None:
            if not role:
                raise CommandError(f"user {user!r} does not exist; pass --role to create it")
            if not Role.objects.filter(name=role).exists():
                raise CommandError(f"unknown role {role!r}")
            account = User.objects.create_user(username=user)
            account.set_unusable_password()
            account.save()
        if role:
            assign_role(account, role)
        if tier and expires_days is None:
            expires_days = MCP_TOKEN_MAX_DAYS
        expires = timezone.now() + timedelta(days=expires_days) if expires_days else None
        try:
            token, raw = ApiToken.mint(account, name, mcp_tier=tier, expires_at=expires, scope_service=service)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        audit("system", "api_token.create", "success", target_type="ApiToken", target_id=token.id,
              detail=f"owner={user} via=mint_token mcp_tier={tier or '-'}")
        self.stdout.write(raw)
