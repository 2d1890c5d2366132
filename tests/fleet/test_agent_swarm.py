"""The swarm's simulated agents never read the host they run on (fleet/management/commands/agent_swarm.py)."""

from fleet.management.commands.agent_swarm import SimulatedAgent, SwarmTelemetry, simulated


def test_a_simulated_agent_neither_scans_software_nor_reads_dex_from_the_host(tmp_path):
    agent = SimulatedAgent("ws://127.0.0.1:1", "token", tmp_path / "a", {"tags": {"environment": "simulated"}},
                           plugins=simulated(), hostname="a", attributes={"simulated": True})
    assert agent.config["inventory_disable"] is True  # AgentClient.session starts no InventorySync
    assert agent.dex is None  # no fleet.agent.dex.Telemetry reading this machine
    assert agent.config["tags"] == {"environment": "simulated"}
    agent.dex = SwarmTelemetry(0)  # --dex: generated facts only
    facts, signals = agent.dex.tick()
    assert set(facts) >= {"yuzu.perf_cpu_pct", "yuzu.net_rtt_p50_ms"} and signals == []
