"""The internal CA end to end, with real processes: daphne, the periodic runner, real agent programs
(`python -m fleet.agent`), the official MCP Python client, and an administrator approving in the admin
with password + TOTP over HTTP.

Must show (issue 19): enrol → certificate issued → reconnect proves it → revoke through the approval flow
(-32006, TOTP approval, recall) → that agent is disconnected within one heartbeat and cannot reconnect; a
forged or an expired certificate is refused. And: a signed script runs on an agent that requires
signatures; the same script with one byte changed, or signed by a revoked signer, is refused and reported."""

import asyncio
import io
import json
import re
import stat
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import websockets
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.core.management import call_command
from django.utils import timezone

from approvals.models import Approval
from fleet.agent import signing
from fleet.agent.client import proof
from fleet.models import Agent, AgentState, Response
from pki import ca
from pki.models import IssuedCert
from tests.support.official_client import DRIVE, MCP_PY, client_env
from tests.support.otp import code
from tests.support.stack import Stack, wait_for
from yuzu.models import TOTPDevice
from yuzu.rbac import seed_builtin_roles

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

HEARTBEAT_S = 3
PASSWORD = "admin-password-1"


@pytest.fixture
def stack(daphne, tmp_path):
    seed_builtin_roles()
    s = Stack(daphne(YUZU_AGENT_HEARTBEAT_S=HEARTBEAT_S), tmp_path)
    yield s
    s.close()


class AgentRun:
    """One agent's state directory, run (and re-run) as a real `python -m fleet.agent` process."""

    def __init__(self, stack, name, config):
        self.stack, self.state = stack, stack.tmp_path / name
        self.state.mkdir()
        (self.state / "config.json").write_text(json.dumps(config))
        out = io.StringIO()
        call_command("mint_device_token", "--name", name, "--max-uses", "1", stdout=out)
        self.token, self.proc = out.getvalue().strip(), None

    def start(self):
        self.proc = self.stack.spawn("agent", [sys.executable, "-m", "fleet.agent", "--server",
                                               f"ws://127.0.0.1:{self.stack.server.port}", "--token", self.token,
                                               "--state-dir", str(self.state)])
        return self

    @property
    def saved(self):
        path = self.state / "state.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def connected(self):
        if self.proc.proc.poll() is not None:
            pytest.fail(f"the agent exited with {self.proc.proc.returncode}\n{self.stack.logs()}")
        agent_id = self.saved.get("agent_id")
        return agent_id if agent_id and Agent.objects.filter(pk=agent_id, connected=True).exists() else None


def ws_register(port, agent_id, credential, cert_pem=None, key_pem=None):
    """One raw connection: challenge, then register (with a certificate and proof when given). Returns the
    close (code, reason), or "registered"."""
    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{port}/agent/v1/ws") as ws:
            await ws.send(json.dumps({"type": "challenge"}))
            nonce = json.loads(await ws.recv())["nonce"]
            msg = {"type": "register", "agent_id": agent_id, "credential": credential, "hostname": "probe"}
            if cert_pem:
                msg.update(cert_pem=cert_pem, proof=proof(key_pem, nonce, agent_id))
            await ws.send(json.dumps(msg))
            try:
                reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
                return reply["type"]
            except websockets.ConnectionClosed as exc:
                return exc.rcvd.code, exc.rcvd.reason
    return asyncio.run(go())


def server_said(stack, text):
    """daphne does not pass WebSocket close reasons on to the peer; the consumer logs each one."""
    return text in Path(stack.server.log).read_text(errors="replace")


def pem_key(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def cert_for(agent_id, key, issuer_key, days):
    now = timezone.now()
    return (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, agent_id)]))
            .issuer_name(ca.ca_cert().subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now + timedelta(days=days[0])).not_valid_after(now + timedelta(days=days[1]))
            .sign(issuer_key, hashes.SHA384()))


def admin_approve(server, username, device, approval_id):
    """Log in to the admin with password + TOTP, then Approve the ticket on its review page."""
    with httpx.Client(base_url=server.base, timeout=15) as http:
        page = http.get("/admin/login/?next=/admin/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        r = http.post("/admin/login/?next=/admin/", data={
            "csrfmiddlewaretoken": csrf, "username": username, "password": PASSWORD,
            "otp_device": device.persistent_id, "otp_token": code(device), "next": "/admin/"})
        assert r.status_code == 302, r.text[-2000:]
        url = f"/admin/approvals/approval/{approval_id}/review/"
        page = http.get(url)
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        r = http.post(url, data={"csrfmiddlewaretoken": csrf, "decision": "approve", "comment": "stolen key"},
                      headers={"Referer": server.base + url})
        assert r.status_code in (200, 302), r.text[-2000:]
    assert Approval.objects.get(pk=approval_id).status == Approval.APPROVED


def test_enrol_prove_revoke_through_approval_and_refuse(stack, mint, make_user, tmp_path):
    if not MCP_PY.exists():
        pytest.fail(f"{MCP_PY} is missing: run `make test`")
    agent = AgentRun(stack, "agent-a", {"tags": {"environment": "e2e"}}).start()
    agent_id = wait_for(agent.connected, 30, "the agent to enrol and connect", stack.logs)

    # enrol → certificate issued (the agent's key stays with it, 0600)
    wait_for(lambda: agent.saved.get("cert_pem"), 30, "the agent's certificate", stack.logs)
    row = IssuedCert.objects.get(purpose="agent", agent_id=agent_id)
    assert x509.load_pem_x509_certificate(agent.saved["cert_pem"].encode()).subject.rfc4514_string() == \
        f"CN={agent_id}"
    assert stat.S_IMODE((agent.state / "agent-key.pem").stat().st_mode) == 0o600

    # reconnect proves it: the restarted agent is admitted, and its credential alone no longer is
    agent.proc.stop()
    wait_for(lambda: not Agent.objects.get(pk=agent_id).connected, 15, "the agent to disconnect", stack.logs)
    agent.start()
    wait_for(agent.connected, 30, "the agent to reconnect with its certificate", stack.logs)
    refused = ws_register(stack.server.port, agent_id, agent.saved["credential"])
    assert refused[0] == 4401 and server_said(stack, "this agent holds a certificate; prove it")

    # a forged certificate (same subject, not signed by the CA) and an expired one (signed by the CA) are refused
    key = ec.generate_private_key(ec.SECP256R1())
    forged = cert_for(agent_id, key, ec.generate_private_key(ec.SECP384R1()), (-1, 30))
    got = ws_register(stack.server.port, agent_id, agent.saved["credential"],
                      forged.public_bytes(serialization.Encoding.PEM).decode(), pem_key(key))
    assert got[0] == 4401 and server_said(stack, "certificate refused: the certificate was not issued by this server's CA")
    expired = cert_for(agent_id, key, ca._ca_key(ca.authority()), (-400, -1))
    IssuedCert.objects.create(serial_hex=ca.serial_of(expired), subject=f"CN={agent_id}", purpose="agent",
                              agent_id=agent_id, not_after=expired.not_valid_after_utc, issued_by="test",
                              cert_pem=expired.public_bytes(serialization.Encoding.PEM).decode(),
                              issuer_fingerprint="", issuer_key_id="")
    got = ws_register(stack.server.port, agent_id, agent.saved["credential"],
                      expired.public_bytes(serialization.Encoding.PEM).decode(), pem_key(key))
    assert got[0] == 4401 and server_said(stack, "certificate refused: the certificate has expired")
    assert Agent.objects.get(pk=agent_id).connected  # none of that disturbed the real agent

    # revoke through the approval flow: official client → -32006; the admin approves with TOTP; recall
    token = mint("sec", role="Administrator", tier="supervised")
    admin = make_user("ann", "Administrator", password=PASSWORD)
    admin.is_staff = True
    admin.save(update_fields=["is_staff"])
    device = TOTPDevice.objects.create(user=admin, name="phone", confirmed=True)
    flag = tmp_path / "approved"
    args = {"serial_hex": row.serial_hex, "reason": "agent key compromise"}
    steps = [{"op": "call", "tool": "revoke_certificate", "args": args},
             {"op": "wait_for_file", "path": str(flag), "timeout": 90},
             {"op": "call", "tool": "revoke_certificate", "as": "recall",
              "args": {**args, "approval_id": "@calls.revoke_certificate.error.data.approval_id"}}]
    client = subprocess.Popen([str(MCP_PY), str(DRIVE), "--url", stack.server.mcp, "--token", token, "--mode",
                               "legacy", "--steps", json.dumps(steps)], cwd=tmp_path, env=client_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ticket = wait_for(lambda: Approval.objects.filter(definition_id="mcp.revoke_certificate").first(), 60,
                          "the approval ticket", stack.logs)
        assert IssuedCert.objects.get(pk=row.pk).status == "active"  # nothing before approval
        admin_approve(stack.server, "ann", device, ticket.id)
        flag.touch()
        revoked_at = wait_for(lambda: IssuedCert.objects.filter(pk=row.pk, status="revoked").exists()
                              and time.monotonic(), 60, "the recall to revoke", stack.logs)
        out, err = client.communicate(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
    obs = json.loads(out)
    assert obs["calls"]["revoke_certificate"]["error"]["code"] == -32006
    recall = obs["calls"]["recall"]
    assert recall.get("error") is None, (recall, err)
    assert recall["structured"]["revoked"] is True and recall["structured"]["crl_republished"] is True

    # disconnected within one heartbeat: the agent process is told 4401 and exits with status 2
    wait_for(lambda: agent.proc.proc.poll() is not None, HEARTBEAT_S, "the agent to be cut off", stack.logs)
    cut_off_s = time.monotonic() - revoked_at
    assert agent.proc.proc.returncode == 2 and cut_off_s < HEARTBEAT_S
    wait_for(lambda: not Agent.objects.get(pk=agent_id).connected, HEARTBEAT_S, "disconnected", stack.logs)
    assert server_said(stack, f"closing agent socket {agent_id} (4401): certificate revoked")
    print(f"revoked agent cut off {cut_off_s * 1000:.0f} ms after its certificate was revoked")

    # and cannot reconnect
    agent.start()
    wait_for(lambda: agent.proc.proc.poll() is not None, 30, "the restarted agent to be refused", stack.logs)
    assert agent.proc.proc.returncode == 2
    assert server_said(stack, "certificate refused: the certificate has been revoked")
    # the CRL served says so
    crl = x509.load_der_x509_crl(httpx.get(stack.server.base + "/api/v1/ca/crl", timeout=10).content)
    assert crl.get_revoked_certificate_by_serial_number(int(row.serial_hex, 16)) is not None


def test_signed_script_runs_tampered_and_revoked_signer_refused(stack, mint):
    bundle = stack.tmp_path / "ca.pem"
    bundle.write_text(httpx.get(stack.server.base + "/api/v1/ca/root", timeout=10).text)
    agent = AgentRun(stack, "agent-s", {"trust_bundle": str(bundle), "require_signature": True,
                                        "crl_max_age": 0, "script_allow": [["echo", "**"]]}).start()
    agent_id = wait_for(agent.connected, 30, "the agent to connect", stack.logs)
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
           .public_bytes(serialization.Encoding.PEM).decode())
    rest = httpx.Client(base_url=stack.server.base, timeout=15,
                        headers={"Authorization": f"Bearer {mint('rel', role='Administrator', tier='')}"})
    r = rest.post("/api/v1/ca/issue", json={"csr_pem": csr, "signer_name": "release", "validity_days": 30,
                                            "justification": "e2e"})
    assert r.status_code == 201, r.text
    signer = r.json()["data"]
    argv = '["echo", "signed by release"]'
    sig = signing.sign(argv.encode(), pem_key(key))

    def run(params):
        r = rest.post("/api/v1/executions", json={"plugin": "script", "action": "run", "agent_ids": [agent_id],
                                                  "params": params})
        assert r.status_code == 202, r.text
        eid = r.json()["data"]["execution_id"]
        return wait_for(lambda: Response.objects.filter(execution_id=eid, status__in=Response.TERMINAL).first(),
                        30, "the agent's answer", stack.logs)

    ok = run({"argv": argv, "signature": sig, "signer_cert": signer["cert_pem"]})
    assert ok.status == AgentState.SUCCESS and "signed by release" in ok.output
    tampered = run({"argv": argv.replace("release", "releasf"), "signature": sig, "signer_cert": signer["cert_pem"]})
    assert tampered.status == AgentState.REJECTED and "does not match its signature" in tampered.error_detail
    unsigned = run({"argv": argv})
    assert unsigned.status == AgentState.REJECTED and "signature required" in unsigned.error_detail
    r = rest.post("/api/v1/ca/revoke", json={"serial_hex": signer["serial_hex"], "reason": "signer key compromise"})
    assert r.status_code == 200 and r.json()["data"]["crl_republished"], r.text
    revoked = run({"argv": argv, "signature": sig, "signer_cert": signer["cert_pem"]})
    assert revoked.status == AgentState.REJECTED and "revoked" in revoked.error_detail
    assert agent.proc.proc.poll() is None  # refused and reported, not crashed
    rest.close()
