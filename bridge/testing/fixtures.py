"""pytest fixtures for the bridge's end-to-end tests, a pytest plugin for the whole suite::

    # registered as a pytest plugin in tests/conftest.py: pytest_plugins = ["bridge.testing.fixtures"]

``stack`` (per module): daphne + the poller process on a private tmux socket, sharing the test
database. ``bridge`` (per test): committed data (transactional_db), the seeded profiles, a quick
stand-in; every pane is closed afterwards. ``primary(username)``: an MCP client with a fresh token.
"""

import shutil
from pathlib import Path

import pytest

from bridge.models import Profile
from bridge.profiles import seed_profiles
from yuzu import secrets
from yuzu.models import KekVersion

from .harness import Mcp, start_stack, wait_until

SERVER_SECRET = "sk-server-own-key-must-not-leak"
needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (Debian package 'tmux')")


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    # The server process carries ANTHROPIC_* of its own: no worker may inherit them.
    s = start_stack(tmp_path_factory.mktemp("bridge"),
                    extra_env={"ANTHROPIC_API_KEY": SERVER_SECRET, "ANTHROPIC_BASE_URL": "https://server.invalid",
                               "YUZU_KEK_DIR": str(tmp_path_factory.mktemp("bridge-keys"))})
    yield s
    s.stop()


def share_server_keys(stack, settings):
    """Seal with the keys the stack's server already holds. The server outlives each test's database (it is
    started once per module) and keeps the KEK it loaded; the test database is emptied between tests, so
    register the server's key files in it again (yuzu.secrets: the database keeps each version's check value)."""
    settings.YUZU_KEK_DIR = Path(stack.env["YUZU_KEK_DIR"])
    secrets.forget_keys()
    for path in sorted(settings.YUZU_KEK_DIR.glob("secrets-kek-v*.key")):
        KekVersion.objects.get_or_create(version=int(path.stem.rsplit("-v", 1)[1]),
                                         defaults={"kcv": secrets.check_value(path.read_bytes())})


@pytest.fixture
def bridge(stack, transactional_db, settings):
    share_server_keys(stack, settings)
    stack.resume_poller()
    seed_profiles()
    Profile.objects.filter(name="standin").update(env={"YUZU_STANDIN_BUSY_SECONDS": "0.4"})
    yield stack
    stack.close_panes()
    stack.pause_poller()  # before transactional_db flushes: a poller writing mid-TRUNCATE can deadlock PostgreSQL


@pytest.fixture
def primary(bridge, mint):
    clients = []

    def make(username="alice", role="Operator", **kw):
        c = Mcp(bridge.bridge_url, mint(username, role=role, **kw))
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()


def spawn_standin(p, profile="standin"):
    r = p.call("bridge_spawn", {"profile": profile})
    assert not r.is_error and r.rpc_error is None, (r.structured, r.rpc_error)
    return r.structured


def status_of(p, sid):
    return p.call("bridge_status", {"sessionId": sid})["workers"][0]


def wait_status(p, sid, want, timeout=10):
    return wait_until(lambda: status_of(p, sid)["agent_status"] in want, timeout, 0.1, f"{sid} {want}")


def pane_env(stack, pane_id, timeout=10):
    """The environment of the program running in a pane (read from /proc once it has exec'd)."""
    pid = next(x.pid for x in stack.backend().list_panes() if x.pane_id == pane_id)

    def read():
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
        except OSError:
            return None
        env = dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)
        return env if "YUZU_BRIDGE_TOKEN" in env else None

    return wait_until(read, timeout, 0.05, f"the environment of pane {pane_id}")
