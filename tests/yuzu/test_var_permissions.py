"""The embedded install's files are private (issue 10, item 6): a fresh var/ is 0700 and every file yuzu
puts in it — the SQLite database and its -wal/-shm files, the secret key — 0600, under the usual 022 umask;
an existing install that is looser gets the yuzu.W001 warning at start-up."""

import json
import os
import stat
import subprocess
import sys

from yuzu.testing import ROOT

PROBE = """
import json, os, django
django.setup()
from django.db import connection
with connection.cursor() as cur:
    cur.execute("select count(*) from django_migrations")  # a connection is open: -wal and -shm exist
    print(json.dumps({name: oct(os.stat(os.path.join(os.environ["YUZU_VAR_DIR"], name)).st_mode & 0o777)
                      for name in sorted(os.listdir(os.environ["YUZU_VAR_DIR"]))}))
"""


def embedded_env(var):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANTHROPIC_", "YUZU_DATABASE_URL", "YUZU_REDIS_URL", "YUZU_SQLITE_PATH",
                                "YUZU_SECRET_KEY", "YUZU_TEST_"))}
    env.update(YUZU_VAR_DIR=str(var), DJANGO_SETTINGS_MODULE="yuzu.settings", YUZU_ADMIN_USER="first-admin")
    return env


def manage(var, *args, code=None):
    argv = [sys.executable, "manage.py", *args] if code is None else [sys.executable, "-c", code]
    proc = subprocess.run(argv, cwd=ROOT, env=embedded_env(var), capture_output=True, text=True, timeout=180,
                          umask=0o022)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def modes(var):
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in sorted(var.iterdir())}


def test_a_fresh_install_is_private_and_a_loose_one_is_reported(tmp_path):
    var = tmp_path / "var"
    manage(var, "migrate", "--noinput", "-v0")
    manage(var, "bootstrap")  # writes the admin, its TOTP seed (sealed: the KEK's file too) and a token
    assert stat.S_IMODE(var.stat().st_mode) == 0o700
    assert modes(var) == {"keys": 0o700, "secret_key": 0o600, "yuzu.sqlite3": 0o600}
    assert modes(var / "keys") == {"secrets-kek-v1.key": 0o600}
    seen = json.loads(manage(var, code=PROBE).stdout.strip().splitlines()[-1])
    assert seen == {"keys": "0o700", "secret_key": "0o600", "yuzu.sqlite3": "0o600", "yuzu.sqlite3-shm": "0o600",
                    "yuzu.sqlite3-wal": "0o600"}
    assert "yuzu.W001" not in manage(var, "check").stderr

    # An install from before this change: var/ 0755, the database 0644. Start-up says so, and changes nothing.
    var.chmod(0o755)
    (var / "yuzu.sqlite3").chmod(0o644)
    out = manage(var, "check").stderr
    assert "yuzu.W001" in out and "2 path(s)" in out, out
    assert f"{var} (drwxr-xr-x)" in out and f"{var / 'yuzu.sqlite3'} (-rw-r--r--)" in out
    assert f"chmod -R go-rwx {var}" in out
    assert stat.S_IMODE(var.stat().st_mode) == 0o755 and modes(var)["yuzu.sqlite3"] == 0o644
