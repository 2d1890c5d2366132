"""The claude-worker's lifecycle hooks post to the hook sink with the worker's own token — and that token never
appears on a command line. Every user on the host can read every process's argv (``ps``); whoever read the token
could call /mcp/bridge/ as that worker (a forged bridge_reply or bridge_ask lands in the primary's session). The
hook command runs here as Claude Code runs it, through the shell, with the real curl behind a shim that records
the argv it was given."""

import http.server
import importlib
import json
import shutil
import subprocess
import threading

import pytest
from django.apps import apps

from bridge.models import Profile
from bridge.profiles import SEEDS

needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed (Debian package 'curl')")
TOKEN = "yuzu_" + "ab12" * 16
SHELLS = [s for s in ("sh", "bash", "dash") if shutil.which(s)]


def hook_commands(argv):
    """The hook commands in a claude-worker argv's --settings JSON."""
    settings = json.loads(argv[argv.index("--settings") + 1])
    return {h["command"] for entries in settings["hooks"].values() for entry in entries for h in entry["hooks"]}


@pytest.fixture
def sink():
    """A hook sink that records what it was sent."""
    got = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            got.append((self.path, self.headers.get("Authorization"), self.headers.get("Content-Type"), body))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", got
    server.shutdown()


@needs_curl
@pytest.mark.parametrize("shell", SHELLS)
def test_the_hook_command_keeps_the_token_off_the_command_line(sink, tmp_path, shell):
    (command,) = hook_commands(SEEDS["claude-worker"]["argv"])
    shim, log = tmp_path / "bin", tmp_path / "argv.log"
    shim.mkdir()
    (shim / "curl").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> {log}\nexec {shutil.which("curl")} "$@"\n')
    (shim / "curl").chmod(0o755)
    url, got = sink
    env = {"PATH": f"{shim}:/usr/local/bin:/usr/bin:/bin", "YUZU_BRIDGE_TOKEN": TOKEN,
           "YUZU_BRIDGE_EVENTS_URL": f"{url}/api/v1/bridge/members/w1/events"}
    payload = b'{"hook_event_name": "Stop", "session_id": "s"}'
    done = subprocess.run([shell, "-c", command], input=payload, env=env, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert got == [("/api/v1/bridge/members/w1/events", f"Bearer {TOKEN}", "application/json", payload)]
    argv = log.read_text()
    assert "curl" not in argv and "events" in argv  # the shim saw curl's arguments
    assert TOKEN not in argv, argv


OLD_HOOK = ('curl -s -m 3 -X POST -H "Authorization: Bearer $YUZU_BRIDGE_TOKEN" -H "Content-Type: application/json" '
            '--data-binary @- "$YUZU_BRIDGE_EVENTS_URL" >/dev/null 2>&1 || true')


@pytest.mark.django_db
def test_an_installed_profile_with_the_old_hook_command_is_rewritten():
    """A profile seeded before (seeds never overwrite a profile) gets the new command; nothing else of it moves."""
    migration = importlib.import_module("bridge.migrations.0005_hook_token_off_argv")
    old_settings = json.dumps({"hooks": {"Stop": [{"hooks": [{"type": "command", "command": OLD_HOOK}]}],
                                         "Notification": [{"hooks": [{"type": "command", "command": "echo hi"}]}]}},
                              separators=(",", ":"))
    edited = Profile.objects.create(name="edited-worker", argv=["claude", "--settings", old_settings, "-p", "x"],
                                    requires_api_base_url=True)
    other = Profile.objects.create(name="other", argv=["claude", "--settings", '{"hooks":{}}'])
    migration.rewrite_hook_command(apps, None)
    edited.refresh_from_db()
    other.refresh_from_db()
    assert edited.argv[:2] == ["claude", "--settings"] and edited.argv[3:] == ["-p", "x"]
    assert hook_commands(edited.argv) == {"echo hi", *hook_commands(SEEDS["claude-worker"]["argv"])}
    assert other.argv == ["claude", "--settings", '{"hooks":{}}']
