"""python manage.py runagent --server URL [--token TOKEN | --local] [--state-dir DIR] [--config FILE]"""

import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from fleet.agent.__main__ import build_parser, run
from fleet.models import Agent

from .mint_device_token import mint_device_token


class Command(BaseCommand):
    help = "Run the yuzu agent program (the same as `python -m fleet.agent`) in the foreground."

    def add_arguments(self, parser):
        build_parser(parser)
        parser.add_argument("--local", action="store_true",
                            help="the agent of this server's own machine: identity under var/agent, enrolled on "
                                 "first run with a single-use device token minted here")

    def handle(self, *args, server, token, state_dir, config, local, **opts):
        if local:
            state_dir = state_dir or str(settings.VAR_DIR / "agent")
            token = token or self.local_token(state_dir)
        code = run(server, token, state_dir, config, opts.get("dex_disable", False))
        if code:
            raise CommandError("the agent cannot continue (see the log above)", returncode=code)

    def local_token(self, state_dir):
        """None while the saved identity is still known to this database; else a fresh one-use token."""
        path = Path(state_dir) / "state.json"
        if path.exists():
            if Agent.objects.filter(pk=json.loads(path.read_text()).get("agent_id")).exists():
                return None
            path.unlink()  # the database was reset: enrol again
        return mint_device_token("local agent", expires_days=1, max_uses=1, via="runagent --local")
