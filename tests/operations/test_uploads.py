"""Upload grants (spec/operator.md §2): minting (bad input, unknown agent), and the agent's HTTPS protocol in
process — redeem once, chunks at the recorded offset, size cap, hash checks, expiry, revocation, cancel — each
refusal with its status and reason, files 0600 with their hashes."""

import hashlib
import stat
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from operations.models import UploadGrant, UploadSession
from operations.uploads import CHUNK_MAX

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def upload_dir(settings, tmp_path):
    settings.YUZU_UPLOAD_DIR = str(tmp_path / "uploads")
    return tmp_path / "uploads"


def mint(mcp, **args):
    grant, error = mcp().tool("mint_upload_grant", {"agent_id": "a1", "declared_max_size": 100, **args})
    assert error is None, error
    return grant


def open_session(c, grant):
    return c.post("/api/v1/uploads", b'{"size": 1}', content_type="application/json",
                  HTTP_X_YUZU_UPLOAD_GRANT=f"{grant['grant_id']}.{grant['grant_secret']}")


def put(c, upload, body, start, total):
    return c.put(f"/api/v1/uploads/{upload['upload_id']}/chunk", body, content_type="application/octet-stream",
                 HTTP_X_YUZU_UPLOAD_SESSION=upload["session_secret"],
                 HTTP_CONTENT_RANGE=f"bytes {start}-{start + len(body) - 1}/{total}")


def commit(c, upload, sha):
    return c.post(f"/api/v1/uploads/{upload['upload_id']}/commit", {"sha256": sha}, content_type="application/json",
                  HTTP_X_YUZU_UPLOAD_SESSION=upload["session_secret"])


def reason(r):
    return r.json()["error"]["reason"]


@pytest.mark.parametrize(("args", "needle"), [
    ({"agent_id": "nope", "declared_max_size": 1}, "not found"),
    ({"agent_id": "a1", "declared_max_size": 0}, "minimum"),
    ({"agent_id": "a1", "declared_max_size": 1, "expected_sha256": "ABC"}, "does not match"),
    ({"agent_id": "a1", "declared_max_size": 1, "retention_class": "forever"}, "is not one of"),
    ({"agent_id": "a1"}, "required"),
])
def test_mint_refuses_bad_input(agent, mcp, args, needle):
    _, error = mcp().tool("mint_upload_grant", args)
    assert error["code"] == -32602 and needle in error["message"], error
    assert not UploadGrant.objects.exists()


def test_grant_ttl_is_clamped_and_only_a_digest_of_the_secret_is_kept(agent, mcp):
    grant = mint(mcp, ttl_secs=86400)
    row = UploadGrant.objects.get(pk=grant["grant_id"])
    assert row.expires_at - row.created_at == timedelta(seconds=900)
    assert row.secret_sha256 == hashlib.sha256(grant["grant_secret"].encode()).hexdigest()
    listed, _ = mcp().tool("list_upload_grants", {})
    assert grant["grant_secret"] not in str(listed) and row.secret_sha256 not in str(listed)


def test_one_file_under_a_grant_then_refused(agent, mcp, upload_dir):
    data = b"x" * 60 + b"y" * 40
    grant = mint(mcp, expected_sha256=hashlib.sha256(data).hexdigest())
    c = Client()
    r = open_session(c, grant)
    assert r.status_code == 201, r.content
    up = r.json()["data"]
    assert up["offset"] == 0 and up["chunk_max_bytes"] == CHUNK_MAX
    assert reason(open_session(c, grant)) == "grant_already_redeemed"
    assert put(c, up, data[:60], 0, 100).status_code == 200
    r = put(c, up, data[60:], 10, 100)  # not at the recorded offset
    assert r.status_code == 409 and reason(r) == "offset_mismatch" and r.json()["error"]["offset"] == 60
    status = c.get(f"/api/v1/uploads/{up['upload_id']}", HTTP_X_YUZU_UPLOAD_SESSION=up["session_secret"]).json()
    assert status["offset"] == 60 and status["state"] == "open"  # resume from here
    assert put(c, up, data[60:], 60, 100).status_code == 200
    r = commit(c, up, hashlib.sha256(data).hexdigest())
    assert r.status_code == 200 and r.json()["state"] == "committed", r.content
    path = upload_dir / "standard" / grant["grant_id"]
    assert path.read_bytes() == data and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert reason(commit(c, up, hashlib.sha256(data).hexdigest())) == "session_terminal"


def test_size_cap_hash_mismatch_expiry_revocation_and_bad_credentials(agent, mcp, upload_dir):
    c = Client()
    up = open_session(c, mint(mcp)).json()["data"]
    r = put(c, up, b"z" * 10, 0, 101)  # declares more than the grant allows
    assert r.status_code == 413 and reason(r) == "size_exceeded"
    assert UploadSession.objects.get(pk=up["upload_id"]).state == "failed"
    assert reason(put(c, up, b"z", 0, 1)) == "session_terminal"

    up = open_session(c, mint(mcp)).json()["data"]
    put(c, up, b"abc", 0, 3)
    r = commit(c, up, "0" * 64)
    assert r.status_code == 422 and reason(r) == "hash_mismatch"
    assert not list((upload_dir / "standard").iterdir())  # the failed files are gone

    grant = mint(mcp)
    UploadGrant.objects.filter(pk=grant["grant_id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    r = open_session(c, grant)
    assert r.status_code == 410 and reason(r) == "expired"

    grant = mint(mcp)
    assert mcp().tool("revoke_upload_grant", {"grant_id": grant["grant_id"]})[0] == {"revoked": True}
    assert open_session(c, grant).status_code == 410
    _, error = mcp().tool("revoke_upload_grant", {"grant_id": grant["grant_id"]})
    assert error["code"] == -32602 and "not found" in error["message"]

    grant = mint(mcp)
    r = c.post("/api/v1/uploads", b"{}", content_type="application/json",
               HTTP_X_YUZU_UPLOAD_GRANT=f"{grant['grant_id']}.{'0' * 64}")
    assert r.status_code == 401 and reason(r) == "grant_unknown"
    r = c.get("/api/v1/uploads/nope", HTTP_X_YUZU_UPLOAD_SESSION="x")
    assert r.status_code == 401 and reason(r) == "session_unknown"
    up = open_session(c, grant).json()["data"]
    r = c.put(f"/api/v1/uploads/{up['upload_id']}/chunk", b"a", content_type="application/octet-stream",
              HTTP_X_YUZU_UPLOAD_SESSION=up["session_secret"], HTTP_CONTENT_RANGE="bytes 0-5/1")
    assert r.status_code == 400 and reason(r) == "bad_range"
    r = c.delete(f"/api/v1/uploads/{up['upload_id']}", HTTP_X_YUZU_UPLOAD_SESSION=up["session_secret"])
    assert r.json()["state"] == "cancelled"


def test_plain_http_is_refused_off_loopback(agent, mcp):
    grant = mint(mcp)
    r = open_session(Client(REMOTE_ADDR="10.0.0.5"), grant)
    assert r.status_code == 400 and reason(r) == "tls_required"
    assert UploadGrant.objects.get(pk=grant["grant_id"]).state == "minted"  # nothing redeemed


def test_hostile_headers_and_bodies_on_the_agent_routes_are_refusals_not_500s(agent, mcp):
    """The upload routes take no bearer token: what anyone may send them. A commit body nested far deeper than the
    json module's stack (parsed before the session was looked at), a Content-Length that is no number, and a
    Content-Range whose numbers int() refuses (over 4,300 digits) were each a 500 with a stack trace in the log."""
    c = Client(raise_request_exception=False)
    r = c.post("/api/v1/uploads/nope/commit", "[" * 100_000, content_type="application/json",
               HTTP_X_YUZU_UPLOAD_SESSION="x")
    assert r.status_code in (400, 401), r.content
    r = c.put("/api/v1/uploads/nope/chunk", b"abc", content_type="application/octet-stream", CONTENT_LENGTH="abc",
              HTTP_X_YUZU_UPLOAD_SESSION="x")
    assert r.status_code in (400, 401), r.content
    up = open_session(c, mint(mcp)).json()["data"]
    r = c.put(f"/api/v1/uploads/{up['upload_id']}/chunk", b"a", content_type="application/octet-stream",
              HTTP_X_YUZU_UPLOAD_SESSION=up["session_secret"], HTTP_CONTENT_RANGE="bytes 0-0/" + "9" * 5000)
    assert r.status_code == 400 and reason(r) == "bad_range", r.content
    r = c.post(f"/api/v1/uploads/{up['upload_id']}/commit", "[" * 100_000, content_type="application/json",
               HTTP_X_YUZU_UPLOAD_SESSION=up["session_secret"])
    assert r.status_code == 400 and reason(r) == "bad_request", r.content
    assert UploadSession.objects.get(pk=up["upload_id"]).state == "open"  # none of it touched the session
