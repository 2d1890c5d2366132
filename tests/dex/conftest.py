"""A small DEX world: agents with facts, tags, groups, observations and app rows (no process, in the test DB)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from dex.models import AppDay, DeviceFacts, Observation
from fleet.models import Agent, ManagementGroup, Tag
from yuzu.models import Role, RolePermission


def agent(agent_id, os="linux", version="1.0", connected=True, **facts):
    a = Agent.objects.create(agent_id=agent_id, hostname=f"{agent_id}.test", os=os, agent_version=version,
                             connected=connected, last_seen=timezone.now())
    if facts:
        DeviceFacts.objects.create(agent=a, **facts)
    return a


def observe(a, obs_type="perf.cpu_sustained", subject="cpu", ago=timedelta(0), platform="linux"):
    now = timezone.now() - ago
    return Observation.objects.create(agent=a, obs_type=obs_type, subject=subject, platform=platform,
                                      observed_at=now, received_at=now)


def app_day(a, app, version, day, cpu, ws=100 * 1024 * 1024):
    return AppDay.objects.create(agent=a, app_name=app, version=version, day=day, samples=10, instances_max=1,
                                 cpu_avg=cpu, cpu_max=cpu * 2, ws_avg_bytes=ws, ws_max_bytes=ws * 2)


@pytest.fixture
def confined(make_user, mint):
    """mint a readonly token for a user holding GuaranteedState:Read fleet-wide but Infrastructure:Read only on
    ``group`` (the Viewer role held on it)."""

    def make(username, group):
        role, _ = Role.objects.get_or_create(name="DexReader")
        RolePermission.objects.get_or_create(role=role, securable="GuaranteedState", operation="Read")
        make_user(username, "DexReader")
        return mint(username, role="Viewer", tier="readonly", group=group)

    return make


@pytest.fixture
def world(db):
    """30 linux agents: hot-00..hot-02 busy, the rest calm; model tags 'a' (even) and 'b' (odd); two groups."""
    g_in = ManagementGroup.objects.create(name="dex-in")
    g_out = ManagementGroup.objects.create(name="dex-out")
    agents = []
    for i in range(30):
        cpu = 95.0 - i if i < 3 else 10.0 + i
        a = agent(f"{'hot' if i < 3 else 'calm'}-{i:02d}", cpu_pct=cpu, commit_pct=40.0 + i,
                  disk_lat_ms=2.0 if i % 5 else None, rtt_ms=10.0 + i, retrans_pct=0.5, throughput_bps=1000.0 * i)
        Tag.objects.create(agent=a, key="model", value="a" if i % 2 == 0 else "b")
        (g_in if i < 15 else g_out).members.add(a)
        agents.append(a)
    agent("silent-01")  # online, sends no perf
    agent("gone-01", connected=False, cpu_pct=99.0)  # offline: not 'now'
    return {"agents": agents, "in": g_in, "out": g_out}
