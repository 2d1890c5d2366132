"""Dispatch alone: claim + send of one execution to N agents whose connections are channels on the configured
layer (no sockets, no agents): time of dispatch_execution, then of receiving every command.

    .venv/bin/python bench/fanout/dispatch_only.py N [REPS]      # embedded: temp SQLite, in-process layer
    YUZU_DATABASE_URL=... YUZU_REDIS_URL=... .venv/bin/python bench/fanout/dispatch_only.py N   # scratch database

Adds N agents (d00000…) and one execution per rep to the database. The channels all live in this one process,
as one server process's agent connections do. Run it from two trees back to back to compare them.
"""

import asyncio
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
TMP = tempfile.mkdtemp(prefix="yuzu-dispatch-")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yuzu.settings")
os.environ.update(YUZU_VAR_DIR=TMP, YUZU_LOG_LEVEL="WARNING")
if not os.environ.get("YUZU_DATABASE_URL"):
    os.environ["YUZU_SQLITE_PATH"] = TMP + "/dispatch.sqlite3"
sys.path.insert(0, str(ROOT))

import django  # noqa: E402

django.setup()

from asgiref.sync import sync_to_async  # noqa: E402
from channels.layers import get_channel_layer  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.utils import timezone  # noqa: E402

from fleet import tasks  # noqa: E402
from fleet.models import Agent, AgentExecStatus, Execution  # noqa: E402
from fleet.push import agent_group  # noqa: E402
from yuzu.celery import app  # noqa: E402


def main():
    n = int(sys.argv[1])
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    call_command("migrate", "--noinput", "-v0")
    app.conf.task_always_eager = True
    tasks._schedule = lambda *a: None  # re-send checks are not measured here
    ids = [f"d{i:05}" for i in range(n)]
    Agent.objects.bulk_create([Agent(agent_id=a, hostname=a, os="linux", connected=True) for a in ids],
                              ignore_conflicts=True)
    layer = get_channel_layer()
    best = []
    for r in range(reps):
        ex = Execution.objects.create(plugin="os", action="info", command_id=f"os-d{r}-{time.time_ns()}",
                                      dispatched_by="bench", agents_targeted=n,
                                      expires_at=timezone.now() + timedelta(minutes=5))
        AgentExecStatus.objects.bulk_create([AgentExecStatus(execution=ex, agent_id=a) for a in ids])

        async def go(ex=ex):
            chans = [await layer.new_channel() for _ in ids]
            for a, c in zip(ids, chans, strict=True):
                await layer.group_add(agent_group(a), c)
            t0 = time.perf_counter()
            sent = await sync_to_async(tasks.dispatch_execution, thread_sensitive=False)(ex.id)
            t1 = time.perf_counter()
            await asyncio.gather(*(layer.receive(c) for c in chans))
            t2 = time.perf_counter()
            for a, c in zip(ids, chans, strict=True):
                await layer.group_discard(agent_group(a), c)
            return sent, t1 - t0, t2 - t0

        sent, dispatch, received = asyncio.run(go())
        assert sent == n, sent
        best.append((dispatch, received))
        print(f"N={n} dispatch {dispatch * 1000:.0f} ms, every command received {received * 1000:.0f} ms", flush=True)
    print(f"RESULT N={n} best dispatch {min(d for d, _ in best) * 1000:.0f} ms, "
          f"best all received {min(t for _, t in best) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
