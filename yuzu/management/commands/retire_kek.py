"""Retire a secrets KEK version that no sealed value uses any more (after rotate_kek + rewrap_secrets): the
version is marked retired and its key file deleted. There is deliberately no MCP or REST tool for this."""

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from yuzu import secrets


class Command(BaseCommand):
    help = "Retire an unused secrets KEK version (deletes its key file)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--version", dest="kek_version", type=int, required=True)

    def handle(self, *args: Any, kek_version: int, **options: Any) -> None:
        try:
            secrets.retire_version(kek_version)
        except secrets.SecretError as exc:
            raise CommandError(f"{exc.failure_class}: {exc}") from None
        self.stdout.write(f"secrets-kek-v{kek_version} retired; its key file is deleted")
