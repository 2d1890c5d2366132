"""python manage.py agent_swarm --count N --server URL --token TOKEN [--state-dir DIR] [--lossy K] [--record FILE]

N simulated agents in one process, each on its own real WebSocket through the normal enrol/register
protocol. They declare ``simulated: true`` in their attributes, report synthetic inventory, and answer
every plugin action instantly with a synthetic result.

For tests of delivery (docs/fleet.md, "Delivery guarantees"): ``--lossy K`` loses messages on purpose
in two of every K agents — agent 0 mod K ignores the first delivery of each command (lost on its way
in), agent 1 mod K runs it but sends nothing about it until the command arrives again (its answers
lost on the way out, so only the kept result answers the re-send). ``--record FILE`` appends one line
``<hostname> <command_id>`` per command run, so a test can check each ran exactly once."""

import asyncio
import logging
import os
import random
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


class SwarmTelemetry:
    """DEX facts of a simulated agent for load tests (``--dex``): values from a cheap generator, never read from
    the machine (5,000 agents reading one host would measure nothing). Real readings: fleet.agent.dex."""

    def __init__(self, index):
        self.rng = random.Random(index)
        self.last = None

    def tick(self):
        r = self.rng
        return ({"yuzu.perf_cpu_pct": f"{r.uniform(1, 100):.1f}", "yuzu.perf_commit_pct": f"{r.uniform(10, 95):.1f}",
                 "yuzu.perf_disk_lat_ms": f"{r.uniform(0.1, 40):.2f}", "yuzu.net_rtt_p50_ms": f"{r.uniform(1, 200):.1f}",
                 "yuzu.net_retrans_pct": f"{r.uniform(0, 3):.2f}",
                 "yuzu.net_throughput_bps": f"{r.uniform(1e3, 1e8):.0f}"}, [])


class SimulatedAgent(AgentClient):
    """Never reads the host: no daily software scan (thousands of one machine's packages and licences per
    agent would make a swarm's connect burst measure inventory ingestion) and no DEX readings (``--dex``
    sends generated ones)."""

    def __init__(self, server, token, state_dir, config, *, loss=None, record=None, **kwargs):
        super().__init__(server, token, state_dir, {**config, "inventory_disable": True, "dex_disable": True},
                         **kwargs)
        self.loss, self.record = loss, record
        self.ignored = set()  # "in": command ids whose first delivery was dropped
        self.muted = set()  # "out": command ids whose answers are being dropped until they arrive again

    async def on_command(self, msg):
        cid = msg.get("command_id")
        if self.loss == "in" and cid not in self.ignored:
            self.ignored.add(cid)
            return
        if self.loss == "out":
            if cid in self.muted:
                self.muted.discard(cid)  # the re-send: answer it for real
            elif cid not in self.seen:
                self.muted.add(cid)
        await super().on_command(msg)

    async def send(self, frame, keep=False):
        if frame.get("command_id") not in self.muted:
            await super().send(frame, keep)

    async def run_command(self, cid, msg):
        if self.record is not None:  # one short O_APPEND write per line: lines never interleave
            os.write(self.record, f"{self.hostname} {cid}\n".encode())
        return await super().run_command(cid, msg)


async def swarm(count, server, token, state_dir, prefix, lossy=0, record=None, dex=False):
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="yuzu-swarm")
    plugins = simulated()
    record = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if record else None

    def client(i):
        hostname = f"{prefix}-{i:05d}"
        loss = {0: "in", 1: "out"}.get(i % lossy) if lossy else None
        agent = SimulatedAgent(server, token, Path(state_dir) / hostname,
                               config={"tags": {"environment": "simulated"}},
                               plugins=plugins, hostname=hostname, attributes={"simulated": True, "swarm_index": i},
                               inventory=lambda: synthetic_inventory(i, hostname), pool=pool, loss=loss, record=record)
        if dex:
            agent.dex = SwarmTelemetry(i)
        return agent

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
        parser.add_argument("--lossy", type=int, default=0, metavar="K",
                            help="tests of delivery: in two of every K agents, lose the first delivery of each "
                                 "command (agent 0 mod K) or the answers to it (agent 1 mod K)")
        parser.add_argument("--record", default=None, metavar="FILE",
                            help="append '<hostname> <command_id>' to FILE for every command run")
        parser.add_argument("--dex", action="store_true",
                            help="send DEX heartbeat facts (generated values, for load tests: bench/dex)")

    def handle(self, *args, count, server, token, state_dir, prefix, lossy, record, dex=False, **opts):
        if not 1 <= count <= 100000:
            raise CommandError("--count must be 1-100000")
        if lossy and lossy < 2:
            raise CommandError("--lossy must be at least 2")
        logging.getLogger("yuzu.agent").setLevel(logging.WARNING)
        self.stdout.write(f"starting {count} simulated agents against {server}; Ctrl-C stops them")
        try:
            failures = asyncio.run(swarm(count, server, token, state_dir or settings.VAR_DIR / "swarm", prefix,
                                         lossy, record, dex))
        except KeyboardInterrupt:
            return
        refused = [f for f in failures if isinstance(f, Refused)]
        raise CommandError(f"{len(failures)} simulated agents stopped ({len(refused)} refused), e.g. {failures[0]}")
