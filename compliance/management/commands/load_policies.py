"""Load PolicyFragment and Policy documents from YAML files (several per file, separated by ``---`` lines),
through the same checks as the REST API. Without arguments: the three shipped examples (docs/compliance.md)."""

import re
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from compliance import services
from compliance.models import Policy, PolicyFragment
from yuzu.errors import YuzuError

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def documents(text):
    return [d for d in re.split(r"(?m)^---\s*$", text) if d.strip()]


class Command(BaseCommand):
    help = "Create the policy fragments and policies of YAML files (default: the shipped examples)."

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="*", help="YAML files (default: compliance/examples/*.yaml)")
        parser.add_argument("--user", default="admin", help="recorded as the author in the audit log")

    def handle(self, *args, **opts):
        user = get_user_model().objects.filter(username=opts["user"]).first()
        who = user or f"cli:{opts['user']}"
        for path in [Path(f) for f in opts["files"]] or EXAMPLES:
            for doc in documents(path.read_text()):
                kind = "Policy" if re.search(r"(?m)^kind:\s*Policy\s*$", doc) else "PolicyFragment"
                name = re.search(r"(?m)^\s+name:\s*(\S+)", doc)
                model = Policy if kind == "Policy" else PolicyFragment
                if name and model.objects.filter(name=name.group(1)).exists():
                    self.stdout.write(f"{kind} {name.group(1)}: exists, skipped")
                    continue
                create = services.create_policy if kind == "Policy" else services.create_fragment
                try:
                    out = create(_Actor(str(who)), doc)
                except YuzuError as exc:
                    raise CommandError(f"{path}: {kind}: {exc.message}") from None
                self.stdout.write(f"{kind} {name.group(1) if name else '?'}: created {out['id']}")


class _Actor:
    def __init__(self, name):
        self.name = name
