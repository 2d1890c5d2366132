"""The transport's guards against a real daphne (issue 10): what another site's page can do with an admin's
session cookie, and test-only switches that must not exist in production."""

import json
import re
import select
import socket
import subprocess
import sys

import httpx
import pytest
from django.contrib.auth import get_user_model

from fleet.models import Agent, Tag
from tests.support.otp import code
from yuzu.models import TOTPDevice
from yuzu.rbac import seed_builtin_roles
from yuzu.testing import ROOT, free_port, server_env

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

PASSWORD = "admin-password-1"
VERSION = "2025-11-25"


def admin_session_cookie(server, username, device):
    """Log in through the admin's own form (password + TOTP), as a person would: the OTP-verified session
    cookie the browser then holds."""
    with httpx.Client(base_url=server.base, timeout=15) as http:
        page = http.get("/admin/login/?next=/admin/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        r = http.post("/admin/login/?next=/admin/", data={
            "csrfmiddlewaretoken": csrf, "username": username, "password": PASSWORD,
            "otp_device": device.persistent_id, "otp_token": code(device), "next": "/admin/"})
        assert r.status_code == 302 and r.headers["location"] == "/admin/", r.text[-2000:]
        return http.cookies["sessionid"]


def tool_call(name, arguments, rid=1):
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


PWN = tool_call("set_tag", {"agent_id": "host-1", "key": "pwned", "value": "yes"})


@pytest.mark.parametrize("streaming", ["on", "off"])
def test_a_cross_origin_page_cannot_use_the_admin_cookie(daphne, make_user, streaming):
    seed_builtin_roles()
    Agent.objects.create(agent_id="host-1", hostname="host-1")
    admin = make_user("root", "Administrator", password=PASSWORD)
    get_user_model().objects.filter(pk=admin.pk).update(is_staff=True)
    device = TOTPDevice.objects.create(user=admin, name="phone", confirmed=True)
    server = daphne(**({"YUZU_MCP_NO_STREAMING": "1"} if streaming == "off" else {}))
    cookie = {"cookie": f"sessionid={admin_session_cookie(server, 'root', device)}"}
    # A page on another port of the same host: the browser treats it as the same site, so its fetch(…,
    # {credentials: "include"}) carries the admin's Lax cookie. A text/plain body needs no CORS preflight.
    evil = f"http://127.0.0.1:{free_port()}"

    def post(body, **headers):
        return httpx.post(server.mcp, content=json.dumps(body), headers={**cookie, **headers}, timeout=15)

    r = post(PWN, origin=evil, **{"content-type": "text/plain;charset=UTF-8"})
    assert r.status_code == 403 and r.json()["error"]["code"] == -32008, r.text
    r = post(PWN, origin=evil, **{"content-type": "application/json"})  # a preflight would stop a browser first
    assert r.status_code == 403 and r.json()["error"]["code"] == -32008, r.text
    r = post(PWN, **{"content-type": "text/plain"})  # a client that sends no Origin still cannot send text
    assert r.status_code == 415 and r.json()["error"]["code"] == -32600, r.text
    r = post(PWN, **{"content-type": "application/x-www-form-urlencoded"})  # an HTML form
    assert r.status_code == 415, r.text
    assert not Tag.objects.filter(key="pwned").exists()

    # Behind those two checks the cookie still works: same origin, application/json.
    same = {"origin": server.base, "content-type": "application/json; charset=utf-8", "accept": "application/json"}
    headers = dict(same)
    if streaming == "on":
        init = post({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                     "params": {"protocolVersion": VERSION, "capabilities": {},
                                "clientInfo": {"name": "admin-page", "version": "0"}}}, **same)
        assert init.status_code == 200, init.text
        headers.update({"mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": VERSION})
    r = post(tool_call("set_tag", {"agent_id": "host-1", "key": "owner", "value": "ops"}), **headers)
    assert r.status_code == 200 and "error" not in r.json(), r.text
    assert Tag.objects.get(agent_id="host-1", key="owner").value == "ops"


def test_the_rest_face_keeps_the_admin_sessions_guards_on_its_own_middleware(daphne, make_user):
    """Under daphne, /api/ requests skip the admin pages' session, CSRF, user, OTP and messages middleware
    (settings.API_MIDDLEWARE, yuzu/lanes.py). What those guarded still holds there: the admin's session cookie
    authenticates REST reads, a write without the CSRF token is refused, with it allowed; the security headers
    are sent, and no cookie is set or refreshed. The admin's pages still run the whole list (the login form's
    CSRF token and session come from it)."""
    seed_builtin_roles()
    admin = make_user("root", "Administrator", password=PASSWORD)
    get_user_model().objects.filter(pk=admin.pk).update(is_staff=True)
    device = TOTPDevice.objects.create(user=admin, name="phone", confirmed=True)
    server = daphne()
    with httpx.Client(base_url=server.base, timeout=15) as browser:
        page = browser.get("/admin/login/?next=/admin/")
        assert "csrftoken" in browser.cookies and page.headers["x-frame-options"] == "DENY"
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        r = browser.post("/admin/login/?next=/admin/", data={
            "csrfmiddlewaretoken": csrf, "username": "root", "password": PASSWORD,
            "otp_device": device.persistent_id, "otp_token": code(device), "next": "/admin/"})
        assert r.status_code == 302 and "sessionid" in browser.cookies, r.text[-2000:]

        r = browser.get("/api/v1/tokens")
        assert r.status_code == 200 and r.json()["data"] == [], r.text
        assert "set-cookie" not in r.headers
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["x-frame-options"] == "DENY"
        assert r.headers["x-correlation-id"].startswith("req-")

        r = browser.post("/api/v1/tokens", json={"name": "from-a-forged-form"})
        assert r.status_code == 403 and "CSRF" in r.json()["error"]["message"], r.text
        r = browser.post("/api/v1/tokens", json={"name": "from-the-admin"},
                         headers={"X-CSRFToken": browser.cookies["csrftoken"], "Referer": server.base + "/admin/"})
        assert r.status_code == 201 and "set-cookie" not in r.headers, r.text
    assert [t["name"] for t in httpx.get(server.base + "/api/v1/tokens", timeout=15, headers={
        "authorization": f"Bearer {r.json()['data']['token']}"}).json()["data"]] == ["from-the-admin"]


def test_the_removed_anonymous_switch_refuses_to_start(tmp_path):
    """YUZU_MCP_TEST_ANONYMOUS_USER used to turn unauthenticated calls into a Viewer. Set on a server now,
    daphne refuses to start instead of serving."""
    port = free_port()
    proc = subprocess.run([sys.executable, "-m", "yuzu.daphne_main", "-b", "127.0.0.1", "-p", str(port), "yuzu.asgi:application"],
                          cwd=ROOT, env=server_env(YUZU_MCP_TEST_ANONYMOUS_USER="viewer"), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    assert "YUZU_MCP_TEST_ANONYMOUS_USER is no longer supported" in proc.stderr


# --- request bodies: bounded while they arrive --------------------------------------------------------------

MiB = 1024 * 1024


def peak_rss(pid):
    """The process's high-water resident set (VmHWM), in bytes."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def read_response(sock, timeout=15):
    """Status, headers and body of one HTTP/1.1 response with a Content-Length."""
    sock.settimeout(timeout)
    raw = b""
    while b"\r\n\r\n" not in raw:
        data = sock.recv(65536)
        assert data, f"connection closed before a response: {raw!r}"
        raw += data
    head, body = raw.split(b"\r\n\r\n", 1)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    while len(body) < int(headers["content-length"]):
        data = sock.recv(65536)
        assert data, "connection closed inside the response body"
        body += data
    return int(status_line.split()[1]), headers, body


def stream_body(port, path, total, headers, chunked=True, piece=256 * 1024):
    """Send a request whose body is `total` bytes, `piece` at a time (chunked, or under the Content-Length in
    `headers`), and stop as soon as the server answers. Returns (bytes sent when the answer came, response)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)  # "sent" ≈ what the server has been given
    sock.settimeout(15)
    sock.connect(("127.0.0.1", port))
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json",
             *(f"{k}: {v}" for k, v in headers.items())]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    data = b"x" * piece
    frame = (b"%x\r\n" % piece + data + b"\r\n") if chunked else data
    sent = 0
    try:
        while sent < total and not select.select([sock], [], [], 0.002)[0]:  # paced: little piles up unread
            sock.sendall(frame)
            sent += piece
        if sent >= total and chunked:
            sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        return sent, read_response(sock)
    finally:
        sock.close()


@pytest.mark.parametrize("path,kind", [("/api/v1/tokens", "api"), ("/admin/login/", "page")])
def test_a_chunked_body_is_refused_as_it_arrives(daphne, path, kind):
    """Unauthenticated, with no Content-Length: the server answers 413 once 4 MiB have arrived, not after
    the 40 MiB the client means to send, and holds none of it in memory."""
    server = daphne()
    before = peak_rss(server.proc.pid)
    sent, (status, headers, body) = stream_body(server.port, path, 40 * MiB, {})
    assert status == 413, body[:500]
    # 4 MiB, plus what the socket buffers on both sides held when the answer went out
    assert sent <= 12 * MiB, f"the answer came after {sent / MiB:.1f} MiB"
    assert headers["connection"] == "close" and headers["x-correlation-id"].startswith("req-")
    if kind == "api":
        error = json.loads(body)["error"]
        assert error["code"] == 413 and error["message"] == "request body exceeds 4 MiB"
    else:
        assert body == b"request body exceeds 4 MiB"
    grown = peak_rss(server.proc.pid) - before
    assert grown < 16 * MiB, f"daphne's peak memory grew by {grown / MiB:.1f} MiB"
    assert httpx.get(server.base + "/healthz", timeout=10).status_code == 200


def test_mcp_refuses_a_body_by_its_head_before_reading_it(daphne):
    """MCP needs the length up front: chunked → 411, a declared length over 4 MiB → 413, both answered from
    the request head alone, while the client has not sent a byte of the body."""
    server = daphne()
    for headers, status in (({"Transfer-Encoding": "chunked"}, 411), ({"Content-Length": str(40 * MiB)}, 413),
                            ({}, 411)):
        with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
            lines = ["POST /mcp/v1/ HTTP/1.1", f"Host: 127.0.0.1:{server.port}", "Content-Type: application/json",
                     *(f"{k}: {v}" for k, v in headers.items())]
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            got, _, body = read_response(sock, timeout=10)
        error = json.loads(body)["error"]
        assert (got, error["code"]) == (status, -32600), (headers, body)
        assert error["message"] == ("request body exceeds 4 MiB" if status == 413 else "Content-Length required")
    assert metric_value(server, "yuzu_mcp_body_too_large_total", reason="no_length") == 2
    assert metric_value(server, "yuzu_mcp_body_too_large_total", reason="too_large") == 1


def test_a_form_body_reaches_the_application_unparsed(daphne):
    """Twisted, under daphne, would parse a form or multipart POST into request.args (which nothing reads) and
    answer a malformed multipart body with a bare 400 and a closed connection of its own. Left unparsed, the
    body reaches the application, which answers in its own error format."""
    server = daphne()
    form = {"Content-Type": "multipart/form-data"}  # no boundary: not a multipart body Twisted could parse
    r = httpx.post(server.base + "/api/v1/tokens", content=b"name=x", headers=form, timeout=15)
    assert r.status_code == 401, r.text
    assert r.json()["error"]["code"] == 401 and r.headers["x-correlation-id"].startswith("req-")
    r = httpx.post(server.base + "/mcp/v1/", content=b"name=x", headers=form, timeout=15)
    assert r.status_code == 415 and r.json()["error"]["message"] == "Content-Type must be application/json"


def metric_value(server, name, **labels):
    want = name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    for line in httpx.get(server.base + "/metrics", timeout=10).text.splitlines():
        if line.startswith(want):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_asgi_limit_counts_a_streamed_body():
    """BodyLimit on its own (servers that stream the body, the in-process communicators): the 413 is sent
    while the body is still arriving, and the application sees no more of it."""
    from asgiref.sync import async_to_sync
    from asgiref.testing import ApplicationCommunicator

    from yuzu.asgi import application

    async def go():
        comm = ApplicationCommunicator(application, {
            "type": "http", "http_version": "1.1", "method": "POST", "path": "/api/v1/tokens",
            "raw_path": b"/api/v1/tokens", "query_string": b"", "scheme": "http",
            "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json")],
            "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5555)})
        for _ in range(5):
            await comm.send_input({"type": "http.request", "body": b"x" * MiB, "more_body": True})
        start = await comm.receive_output(5)
        assert start["type"] == "http.response.start" and start["status"] == 413
        body = await comm.receive_output(5)
        assert json.loads(body["body"])["error"]["message"] == "request body exceeds 4 MiB"
        await comm.send_input({"type": "http.request", "body": b"x" * MiB, "more_body": False})
        await comm.wait(5)  # the application ended without answering again
        assert comm.output_queue.empty()

    async_to_sync(go)()
