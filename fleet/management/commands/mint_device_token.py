"""python manage.py mint_device_token --name NAME [--expires-days N] [--max-uses N | --unlimited-uses]

A token enrols one agent unless told otherwise (docs/fleet.md): a leaked token of unlimited uses let anyone
who held it enrol devices without end."""

import secrets
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from fleet.models import DeviceToken
from yuzu.audit import audit
from yuzu.models import hash_secret

PREFIX = "yzd_"


def mint_device_token(name, *, expires_days=None, max_uses=1, via="mint_device_token"):
    """Create a device enrolment token of ``max_uses`` enrolments (None: unlimited, asked for explicitly); returns
    the raw ``yzd_<64 hex>`` value (only its hash is stored)."""
    raw = PREFIX + secrets.token_hex(32)
    token = DeviceToken.objects.create(
        name=name, token_hash=hash_secret(raw), max_uses=max_uses,
        expires_at=timezone.now() + timedelta(days=expires_days) if expires_days else None)
    audit("system", "device_token.create", "success", target_type="DeviceToken", target_id=token.id,
          detail=f"name={name} via={via} max_uses={max_uses or '-'} expires_days={expires_days or '-'}")
    return raw


class Command(BaseCommand):
    help = "Mint a device enrolment token for agents and print it once (only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True, help="what the token is for, e.g. 'lab rack 3'")
        parser.add_argument("--expires-days", type=int, help="expire after this many days (default: never)")
        uses = parser.add_mutually_exclusive_group()
        uses.add_argument("--max-uses", type=int, help="how many agents may enrol with it (default: 1)")
        uses.add_argument("--unlimited-uses", action="store_true",
                          help="any number of agents may enrol with it until it expires or is revoked")

    def handle(self, *args, name, expires_days, max_uses, unlimited_uses, **opts):
        if not name or len(name) > 256:
            raise CommandError("--name must be 1-256 characters")
        if expires_days is not None and expires_days < 1:
            raise CommandError("--expires-days must be at least 1")
        if max_uses is not None and max_uses < 1:
            raise CommandError("--max-uses must be at least 1")
        max_uses = None if unlimited_uses else 1 if max_uses is None else max_uses
        self.stdout.write(mint_device_token(name, expires_days=expires_days, max_uses=max_uses))
