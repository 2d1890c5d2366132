"""Fixtures of the fault suite (issue 22, docs/operations.md): private Redis and PostgreSQL instances the
tests may kill, and the server processes on them. Never the shared services."""

import os
import shutil
from pathlib import Path

import httpx
import pytest

from .services import PG_BIN, Cluster, private_postgres, private_redis

LONG = os.environ.get("YUZU_FAULTS_LONG") == "1"
long_only = pytest.mark.skipif(not LONG, reason="a long fault scenario: run it with `make faults` (YUZU_FAULTS_LONG=1)")

needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None,
                                 reason="needs redis-server (Debian package redis-server) to run a private instance")
needs_postgres = pytest.mark.skipif(not (PG_BIN / "initdb").exists(),
                                    reason=f"needs PostgreSQL 15 server binaries in {PG_BIN} (postgresql-15)")


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.faults)
            item.add_marker(pytest.mark.live)
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def pg(tmp_path):
    with private_postgres(tmp_path) as p:
        yield p


@pytest.fixture
def redis_server(tmp_path):
    with private_redis(tmp_path) as r:
        yield r


@pytest.fixture
def cluster_on(tmp_path):
    made = []

    def make(**kw):
        c = Cluster(tmp_path, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def http():
    with httpx.Client(trust_env=False, timeout=30) as c:
        yield c
