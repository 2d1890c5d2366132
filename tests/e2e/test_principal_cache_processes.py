"""The principal cache across server processes: two daphnes on Redis (sessions shared), each with the principal
cached; a role removed or a token revoked in the database is refused on the very next call by both."""

import os
import shutil

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from bridge.testing.harness import start_redis
from yuzu.models import ApiToken, RoleAssignment, RolePermission
from yuzu.testing import free_port, server_env, start_daphne

pytestmark = pytest.mark.live


class Remote:
    """A session on one server used from two: the session store is Redis, so B knows A's session."""

    def __init__(self, token, base):
        self.token, self.n = token, 0
        self.http = httpx.Client(timeout=20, trust_env=False)
        r = self.http.post(base + "/mcp/v1/", headers=self.headers(), json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t"}}})
        assert r.status_code == 200, r.text
        self.sid = r.headers["mcp-session-id"]

    def headers(self):
        h = {"authorization": f"Bearer {self.token}", "accept": "application/json, text/event-stream",
             "content-type": "application/json", "mcp-protocol-version": "2025-11-25"}
        if getattr(self, "sid", None):
            h["mcp-session-id"] = self.sid
        return h

    def list_agents(self, base):
        self.n += 1
        r = self.http.post(base + "/mcp/v1/", headers=self.headers(), json={
            "jsonrpc": "2.0", "id": self.n, "method": "tools/call", "params": {"name": "list_agents", "arguments": {}}})
        if r.status_code == 401:
            return "401"
        body = r.json()
        return "ok" if "result" in body and not body["result"].get("isError") else body["error"]["code"]


def test_two_processes_refuse_on_the_very_next_call(transactional_db, tmp_path, mint):
    redis_url = os.environ.get("YUZU_REDIS_URL")
    procs = []
    if not redis_url:
        if shutil.which("redis-server") is None:
            pytest.skip("neither YUZU_REDIS_URL nor redis-server (Debian package 'redis-server')")
        redis, redis_url = start_redis(tmp_path)
        procs.append(redis)
    try:
        env = server_env(YUZU_REDIS_URL=redis_url)
        a, b = free_port(), free_port()
        procs += [start_daphne(a, env, tmp_path, "daphne-A"), start_daphne(b, env, tmp_path, "daphne-B")]
        base_a, base_b = f"http://127.0.0.1:{a}", f"http://127.0.0.1:{b}"
        raw = mint("alice", tier="operator")
        c = Remote(raw, base_a)
        for _ in range(3):  # both processes have the principal cached
            assert c.list_agents(base_a) == "ok" and c.list_agents(base_b) == "ok"
        RoleAssignment.objects.filter(user__username="alice").delete()  # removed on neither server
        assert c.list_agents(base_b) == -32003
        assert c.list_agents(base_a) == -32003
        alice = get_user_model().objects.get(username="alice")
        RoleAssignment.objects.create(user=alice, role_id=RolePermission.objects.filter(
            role__name="Operator").values_list("role_id", flat=True)[0])
        assert c.list_agents(base_b) == "ok" and c.list_agents(base_a) == "ok"
        ApiToken.objects.filter(owner=alice).update(revoked_at=timezone.now())
        assert c.list_agents(base_b) == "401"
        assert c.list_agents(base_a) == "401"
    finally:
        for p in reversed(procs):
            p.stop()
