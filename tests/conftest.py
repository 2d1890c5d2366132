"""Shared fixtures: users with roles, tokens, principals, and real server processes."""

import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from yuzu.models import ApiToken
from yuzu.rbac import Principal, assign_role

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def make_user(db):
    def make(username, role=None, group=None, superuser=False, password=None):
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None:
            user = (User.objects.create_superuser(username, "", password or "pw-" + username) if superuser
                    else User.objects.create_user(username, password=password))
        if role:
            assign_role(user, role, group)
        return user

    return make


@pytest.fixture
def mint(make_user):
    """mint(username, role=..., tier=...) → raw token; creates the user and role assignment if needed."""

    def mint(username="alice", role="Operator", tier="", days=30, group=None, **kw):
        user = make_user(username, role, group)
        expires = timezone.now() + timedelta(days=days) if days is not None else None
        _, raw = ApiToken.mint(user, f"{username}-token", mcp_tier=tier, expires_at=expires, **kw)
        return raw

    return mint


@pytest.fixture
def principal(make_user):
    def make(username="alice", role="Operator", tier="", group=None):
        user = make_user(username, role, group)
        token = None
        if tier is not None:
            token, _ = ApiToken.mint(user, "p", mcp_tier=tier,
                                     expires_at=timezone.now() + timedelta(days=30) if tier else None)
        return Principal(user=user, token=token)

    return make


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(**extra):
    """Environment for a server process that shares the test database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        env["YUZU_SQLITE_PATH"] = str(db["NAME"])
        env.pop("YUZU_DATABASE_URL", None)
    else:
        user = db.get("USER") or "postgres"
        env["YUZU_DATABASE_URL"] = f"postgres://{user}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"
    env["DJANGO_SETTINGS_MODULE"] = "yuzu.settings"
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Daphne:
    def __init__(self, port, proc, log):
        self.port, self.proc, self.log = port, proc, log
        self.base = f"http://127.0.0.1:{port}"
        self.mcp = self.base + "/mcp/v1/"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def start_daphne(tmp_path, **env):
    port = free_port()
    log = open(tmp_path / f"daphne-{port}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                             "yuzu.asgi:application"], cwd=ROOT, env=server_env(**env), stdout=log,
                            stderr=subprocess.STDOUT)
    server = Daphne(port, proc, log)
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daphne exited: {(tmp_path / f'daphne-{port}.log').read_text()[-2000:]}")
        try:
            if httpx.get(server.base + "/healthz", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.stop()
    raise RuntimeError("daphne did not become healthy")


@pytest.fixture
def daphne(transactional_db, tmp_path):
    """A real daphne process on the test database (data must be committed: transactional tests)."""
    servers = []

    def start(**env):
        s = start_daphne(tmp_path, **env)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()
