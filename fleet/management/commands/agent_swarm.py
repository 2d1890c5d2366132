"""python manage.py agent_swarm --count N --server URL --token TOKEN [--state-dir DIR]

N simulated agents in one process, each on its own real WebSocket through the normal enrol/register
protocol. They declare ``simulated: true`` in their attributes, report synthetic inventory, and answer
every plugin action instantly with a synthetic result."""

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from fleet.agent.client import AgentClient, Refused
from fleet.agent.plugins import simulated


def synthetic_inventory(index, hostname):
    return {"hostname": hostname, "system": "Linux", "kernel": "6.1.0-simulated", "machine": "x86_64",
            "distribution": "Simulated Linux", "distribution_id": "simulated", "cpu_count": 2 + index % 8,
            "memory_total": (4 + index % 4) * 2**30, "simulated": True}


async def swarm(count, server, token, state_dir, prefix):
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="yuzu-swarm")
    plugins = simulated()

    def client(i):
        hostname = f"{prefix}-{i:05d}"
        return AgentClient(server, token, Path(state_dir) / hostname, config={"tags": {"environment": "simulated"}},
                           plugins=plugins, hostname=hostname, attributes={"simulated": True, "swarm_index": i},
                           inventory=lambda: synthetic_inventory(i, hostname), pool=pool)

    async def start(i, agent):
        await asyncio.sleep(i * 0.005)  # spread the connects
        await agent.run()

    results = await asyncio.gather(*(start(i, client(i)) for i in range(count)), return_exceptions=True)
    return [r for r in results if isinstance(r, Exception)]


class Command(BaseCommand):
    help = "Run N simulated agents over real WebSockets in this process (Ctrl-C stops them)."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, required=True)
        parser.add_argument("--server", required=True, help="ws:// URL of the yuzu server")
        parser.add_argument("--token", required=True, help="device token allowing at least --count enrolments")
        parser.add_argument("--state-dir", default=None, help="identities of the simulated agents (default var/swarm)")
        parser.add_argument("--prefix", default="sim", help="hostname prefix")

    def handle(self, *args, count, server, token, state_dir, prefix, **opts):
        if not 1 <= count <= 100000:
            raise CommandError("--count must be 1-100000")
        logging.getLogger("yuzu.agent").setLevel(logging.WARNING)
        self.stdout.write(f"starting {count} simulated agents against {server}; Ctrl-C stops them")
        try:
            failures = asyncio.run(swarm(count, server, token, state_dir or settings.VAR_DIR / "swarm", prefix))
        except KeyboardInterrupt:
            return
        refused = [f for f in failures if isinstance(f, Refused)]
        raise CommandError(f"{len(failures)} simulated agents stopped ({len(refused)} refused), e.g. {failures[0]}")
