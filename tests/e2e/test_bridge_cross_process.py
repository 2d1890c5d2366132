"""The rendezvous across server processes: the primary waits on daphne A while the worker's
bridge_reply is handled by daphne B (its YUZU_BRIDGE_URL). With channels-redis (YUZU_REDIS_URL) the
wake crosses processes at once — the waiters' periodic re-read is set to 30 s here, so only the
channel layer can resolve it in time. With the in-memory layer (embedded mode) the wake is lost
across processes and the re-read of the Turn row resolves the waiter."""

import os
import shutil
import time
import uuid

import pytest

from bridge.models import Profile
from bridge.profiles import seed_profiles
from bridge.testing.fixtures import needs_tmux
from bridge.testing.harness import (
    DEFAULT_TIMING,
    BridgeStack,
    Mcp,
    free_port,
    server_env,
    start_daphne,
    start_poller,
    start_redis,
)

pytestmark = [pytest.mark.live, needs_tmux]


@pytest.mark.parametrize("layer", ["redis", "memory"])
def test_reply_on_another_process_resolves_the_waiter(layer, transactional_db, tmp_path, mint):
    if layer == "redis" and shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian package 'redis-server')")
    procs = []
    redis = None
    port_a, port_b = free_port(), free_port()
    sock = f"yuzu-bx-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    extra = {**DEFAULT_TIMING, "YUZU_BRIDGE_TMUX_SOCKET": sock,
             "YUZU_BRIDGE_URL": f"http://127.0.0.1:{port_b}/mcp/bridge/",
             "YUZU_BRIDGE_RECHECK_SECONDS": "30" if layer == "redis" else "0.5"}
    try:
        if layer == "redis":
            redis, url = start_redis(tmp_path)
            procs.append(redis)
            extra["YUZU_REDIS_URL"] = url
        env = server_env(**extra)
        procs.append(start_daphne(port_a, env, tmp_path, "daphne-A"))
        procs.append(start_daphne(port_b, env, tmp_path, "daphne-B"))
        procs.append(start_poller(env, tmp_path))
        stack = BridgeStack(base=f"http://127.0.0.1:{port_a}", socket_name=sock, env=env, log_dir=tmp_path,
                            procs=procs)
        seed_profiles()
        Profile.objects.filter(name="standin").update(env={"YUZU_STANDIN_BUSY_SECONDS": "0.4"})
        p = Mcp(stack.bridge_url, mint("alice", role="Operator"))
        w = p.call("bridge_spawn", {"profile": "standin"}).structured
        # Warm up: the worker is idle and its MCP session (on B) is open before we time anything.
        assert p.call("bridge_send", {"content": "reply:warm", "sessionId": w["sessionId"],
                                      "timeoutMs": 20000})["text"] == "warm", stack.logs()
        t0 = time.monotonic()
        r = p.call("bridge_send", {"content": "reply:across processes", "sessionId": w["sessionId"],
                                   "timeoutMs": 20000})
        elapsed = time.monotonic() - t0
        assert r["outcome"] == "reply" and r["text"] == "across processes", (r.structured, stack.logs())
        assert elapsed < 8, elapsed
        # The clarification round trip crosses processes both ways (question → A, answer → B's ask).
        q = p.call("bridge_send", {"content": "ask:which?", "sessionId": w["sessionId"], "timeoutMs": 20000})
        assert q["outcome"] == "question"
        t0 = time.monotonic()
        a = p.call("bridge_send", {"content": "that one", "turnId": q["turnId"], "timeoutMs": 20000})
        assert a["text"] == "answered:that one" and time.monotonic() - t0 < 8
        p.close()
    finally:
        for proc in reversed(procs):
            proc.stop()
        from bridge.terminal import TmuxBackend

        TmuxBackend(sock).shutdown()
