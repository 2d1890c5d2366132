"""Shared fixtures: users with roles, tokens, principals, and real server processes."""

import shutil
import subprocess
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from bridge.conf import socket_name
from bridge.terminal import TmuxBackend
from tests.support.servers import start_daphne
from yuzu.celery import app as celery_app
from yuzu.models import ApiToken
from yuzu.rbac import Principal, assign_role

pytest_plugins = ["bridge.testing.fixtures"]  # the bridge's fixtures: primary, bridge, stack, ...


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


@pytest.fixture(scope="session", autouse=True)
def bridge_tmux_server():
    """In-process bridge calls (the fuzz, the authorization matrix) may auto-spawn stand-in workers on this
    installation's tmux server: end that server after the session, unless it was running before it began (a
    `make run` of this checkout keeps its workers)."""
    tmux = shutil.which("tmux")
    name = socket_name()
    was_running = bool(tmux) and subprocess.run([tmux, "-L", name, "list-sessions"], capture_output=True).returncode == 0
    yield
    if tmux and not was_running:
        TmuxBackend(name).shutdown()  # the server, its socket file, and its private directory of env files


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's, then at the end of the session: the connections other threads of this process opened (the
    async tests' sync_to_async threads, the race tests' pools) are ended on PostgreSQL before the test database is
    dropped, which refuses while any is open ("is being accessed by other users") and left the database behind."""
    yield
    if connection.vendor == "postgresql":
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")


@pytest.fixture
def eager_celery():
    """Embedded mode's Celery (eager) even when YUZU_REDIS_URL is set: no worker runs in these tests."""
    old = celery_app.conf.task_always_eager
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = True
    yield
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = old


@pytest.fixture(autouse=True)
def private_kek_dir(tmp_path_factory, settings):
    """Each test gets its own key directory for the secrets at rest (yuzu.secrets): the test database is
    emptied between tests, and key files left by another test would not match it."""
    from yuzu import secrets

    settings.YUZU_KEK_DIR = tmp_path_factory.mktemp("keys")
    secrets.forget_keys()
    yield
    secrets.forget_keys()


@pytest.fixture(autouse=True)
def fresh_channel_layers():
    """In-process tests drive the ASGI app on a new event loop each time; a Redis channel layer binds its
    locks to the first loop that used it, so every test starts with fresh layer instances."""
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


def pytest_collection_modifyitems(items):
    """`e2e`: everything under tests/e2e/, and every test elsewhere that starts real processes (`live`), so that
    `make test PYTEST_ARGS="-m 'not e2e'"` is the fast inner loop."""
    e2e = pytest.mark.e2e
    for item in items:
        if "e2e" in item.path.parts[-2:-1] or item.get_closest_marker("live"):
            item.add_marker(e2e)
