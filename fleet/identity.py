"""Agent identity, as the agent socket (fleet.consumers) asks for it: enrolment trades a device token for
an agent id and credential; register checks the credential and records what the agent reports. Each is
a cross-model operation in one transaction, audited here; the connection state itself is the Agent
model's (AgentQuerySet: connect, seen, disconnected). Refused enrolments and registers are audited
without letting an unauthenticated peer flood the audit log (FailureAudit).

Invariants: a device token never serves more enrolments than its max_uses (DeviceToken.claim is one
conditional UPDATE); a credential is compared in constant time, against a dummy hash when the agent is
unknown; the newest connection of an agent wins (Agent.objects.connect)."""

import asyncio
import contextvars
import hmac
import logging
import secrets
from dataclasses import dataclass

from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone

from pki import ca
from pki.models import IssuedCert
from yuzu.audit import audit
from yuzu.metrics import AGENT_AUTH_FAILURES, CA_REISSUE_BLOCKED, CA_REVOKED_CERT
from yuzu.models import hash_secret, new_hex_id

from .batching import Batcher
from .models import Agent, AgentInventory, DeviceToken, Tag

log = logging.getLogger("yuzu.fleet.agents")

AUDIT_WINDOW_S = 60  # refused enrolments/registers: at most one audit row per source address per window
MAX_AUDIT_SOURCES = 10000  # source addresses tracked at once; beyond that they share one window
_DUMMY_HASH = hash_secret("no such agent")


@dataclass(frozen=True)
class Failure:
    """The audit row of a refused enrolment or register (written by FailureAudit)."""

    action: str
    principal: str
    target_type: str
    target_id: str
    detail: str


class Refused(Exception):
    """The token or credential is not accepted (the socket closes 4401)."""

    def __init__(self, message, failure=None):
        super().__init__(message)
        self.failure = failure


class Superseded(Exception):
    """A newer connection of this agent has registered (the socket closes 4409)."""


def enroll(token, hostname):
    """Trade a device enrolment token for a new agent identity: returns (agent_id, credential)."""
    now = timezone.now()
    dt = DeviceToken.objects.filter(token_hash=hash_secret(token)).first()
    agent_id, credential = new_hex_id(16), "yza_" + secrets.token_hex(32)
    with transaction.atomic():
        claimed = dt is not None and dt.claim(now)
        if claimed:
            Agent.objects.create(agent_id=agent_id, hostname=hostname, credential_hash=hash_secret(credential),
                                 enrolled_at=now)
    who = f"device_token:{dt.name}" if dt else "device_token:unknown"
    if not claimed:
        reason = "unknown token" if dt is None else dt.refusal(now)
        raise Refused("enrolment refused: the device token is not valid",
                      Failure("agent.enroll", who, "DeviceToken", dt.id if dt else "",
                              f"hostname={hostname} reason={reason}"))
    audit(who, "agent.enroll", "success", target_type="Agent", target_id=agent_id,
          detail=f"hostname={hostname} device_token={dt.id}")
    return agent_id, credential


def register(agent_id, credential, fields, tags, plugins, opened_at, proof=None):
    """Verify the credential (constant time) and, for an agent that holds a certificate, its proof of
    possession (``proof`` = (cert_pem, signature, nonce): pki.ca.verify_agent_proof); refresh what the agent
    reports (``fields``, its tags — Tag.objects.report: never the SERVER_TAG_KEYS, nor a key set on the server —
    and its plugin catalogue), mark it connected as of the connection opened at ``opened_at``. The newest
    connection wins: if one opened later has registered already, this one is stale (its agent has reconnected
    since) and is refused with Superseded, changing nothing. Returns (tags, the serial of the certificate proved
    or None)."""
    agent = Agent.objects.filter(pk=agent_id).first()
    stored = agent.credential_hash if agent and agent.credential_hash else _DUMMY_HASH
    if not hmac.compare_digest(stored, hash_secret(credential)) or agent is None:
        raise Refused("invalid agent credential",
                      Failure("agent.register", f"agent:{agent_id}", "Agent", agent_id, "invalid credential"))
    serial = _check_proof(agent_id, proof)
    now = timezone.now()
    with transaction.atomic():
        if not Agent.objects.connect(agent_id, opened_at, simulated=bool(fields["attributes"].get("simulated")),
                                     **fields):
            raise Superseded("a newer connection of this agent has registered")
        for key, value in Tag.objects.report(agent_id, tags, now).items():  # the server's keys: they win
            log.info("agent %s reported %s=%r at register over the server's tag: ignored", agent_id, key, value)
        AgentInventory.objects.store(agent_id, AgentInventory.CATALOGUE, plugins, now)
    return dict(Tag.objects.filter(agent_id=agent_id).values_list("key", "value")), serial


def _check_proof(agent_id, proof):
    """Gradual enforcement (spec/pki.md §1): an agent that was never issued a certificate is admitted on
    its credential alone; once it has one, every connection must prove it (a stolen credential is not
    enough), and a revoked one is refused. Returns the proved serial, or None."""
    def refuse(why):
        raise Refused(f"certificate refused: {why}",
                      Failure("agent.register", f"agent:{agent_id}", "Agent", agent_id, f"certificate: {why}"))

    if proof is None:
        if IssuedCert.objects.filter(purpose="agent", agent_id=agent_id).exists():
            refuse("this agent holds a certificate; prove it (challenge, then register with cert_pem and proof)")
        return None
    try:
        return ca.verify_agent_proof(agent_id, *proof).serial_hex
    except ca.CertError as exc:
        if "revoked" in str(exc):
            CA_REVOKED_CERT.labels("register").inc()
        refuse(str(exc))


def enroll_certificate(agent_id, csr_pem, proved_serial):
    """cert.enroll on a registered connection: issue the agent's leaf for its CSR (pki.ca.issue_agent_cert).
    Allowed when the agent has no active certificate, or the one this connection proved is in its renewal
    window (the last third of its life). While a revocation of the agent's certificate stands and it has no
    active one, or the certificate this connection proved has been revoked since, re-issue is blocked (audited).
    An agent whose credential is revoked (or that is gone) gets none: its connection is open only until the
    revocation's push or its next heartbeat closes it, and revoke_agent_credential revokes the certificates it finds
    under the same row lock — one issued after it would stay active.
    Returns (the IssuedCert, the CA chain PEM); raises pki.ca.CertError."""
    with transaction.atomic():
        # One enrolment of an agent at a time (its row locked): two connections enrolling at once each found no
        # active certificate, and the agent held two.
        agent = Agent.objects.select_for_update().filter(pk=agent_id).first()
        if agent is None or not agent.credential_hash:
            raise ca.CertError("this agent's credential is revoked")
        mine = IssuedCert.objects.filter(purpose="agent", agent_id=agent_id)
        active = mine.active()
        row = active.filter(pk=proved_serial).first() if proved_serial is not None else None
        # A connection whose proved certificate was revoked since is still open until the revocation's push (or
        # its next heartbeat) closes it: it is not an agent without a certificate.
        blocked = (proved_serial is not None and row is None) or (
            proved_serial is None and not active.exists() and mine.filter(status=IssuedCert.REVOKED).exists())
        if not blocked:
            if row is not None:
                if timezone.now() < row.issued_at + (row.not_after - row.issued_at) * 2 / 3:
                    raise ca.CertError("the current certificate is not yet due for renewal")
            elif active.exists():
                raise ca.CertError("this agent already holds a certificate")
            return ca.issue_agent_cert(agent_id, ca.load_csr(csr_pem)), ca.authority().cert_pem
    CA_REISSUE_BLOCKED.inc()  # audited outside the transaction: the refusal's row must outlive it
    audit(f"agent:{agent_id}", "ca.cert.reissue_blocked", "denied", target_type="Agent", target_id=agent_id,
          detail="the agent's certificate is revoked")
    raise ca.CertError("re-issue is blocked: this agent's certificate was revoked")


def heartbeats(beats):
    """Heartbeats ``[(agent_id, proved serial or None), …]`` from a server process's connections, in one go: the
    agents are seen (one UPDATE), and each one's result is False when the certificate its connection proved has
    been revoked since (the store is checked, not the CRL: one query), or the agent's credential has been revoked
    or its row deleted (one query): what closes the connection when the channel layer's message was lost."""
    ids = {agent_id for agent_id, _ in beats}
    Agent.objects.seen(ids)
    admitted = set(Agent.objects.filter(pk__in=ids).exclude(credential_hash="").values_list("pk", flat=True))
    active = ca.active_serials({serial for _, serial in beats if serial is not None})
    cert_ok = [serial is None or serial in active for _, serial in beats]
    if revoked := cert_ok.count(False):
        CA_REVOKED_CERT.labels("heartbeat").inc(revoked)
    return [ok and agent_id in admitted for ok, (agent_id, _) in zip(cert_ok, beats, strict=True)]


async def _heartbeats(beats):
    return await database_sync_to_async(heartbeats)(beats)


heartbeat = Batcher(_heartbeats, "heartbeats")
"""``await heartbeat.submit((agent_id, serial))``: a connection's heartbeat, batched with the process's others."""


# --- refused enrolments and registers: audited, but not one row each ---------------------------

def _audit_failure(source, failure, count=None):
    """One audit row: a first failure (``count`` None), or the ``count`` failures of a closed window."""
    detail = (f"{failure.detail} source={source}" if count is None else
              f"source={source} failures={count} in the last {AUDIT_WINDOW_S} s; last: {failure.detail}")
    audit(failure.principal, failure.action, "failure", target_type=failure.target_type,
          target_id=failure.target_id, detail=detail)


class FailureAudit:
    """Refused enrolments and registers, audited without letting an unauthenticated peer flood the
    audit log: the first failure of a source address (per action) is written at once; the ones after it
    within AUDIT_WINDOW_S are counted, and written as one row carrying the count when the window ends
    (which opens the next window). So a source costs at most one row per window. Every failure counts
    in yuzu_agent_auth_failures_total. Per server process (per event loop, like the consumers' batcher)."""

    def __init__(self):
        self.loop, self.windows = None, {}

    async def record(self, source, failure):
        AGENT_AUTH_FAILURES.labels(failure.action.removeprefix("agent.")).inc()
        loop = asyncio.get_running_loop()
        if self.loop is not loop:
            self.loop, self.windows = loop, {}
        if (source, failure.action) not in self.windows and len(self.windows) >= MAX_AUDIT_SOURCES:
            source = "(many sources)"
        window = self.windows.get((source, failure.action))
        if window is not None:
            window["count"] += 1
            window["last"] = failure
            return
        self.open((source, failure.action))
        await database_sync_to_async(_audit_failure)(source, failure)

    def open(self, key):
        self.windows[key] = {"count": 0, "last": None}
        self.loop.call_later(AUDIT_WINDOW_S, lambda: self.loop.create_task(self.close(key)),
                             context=contextvars.Context())

    async def close(self, key):
        window = self.windows.pop(key, None)
        if window and window["count"]:
            self.open(key)
            await database_sync_to_async(_audit_failure)(key[0], window["last"], window["count"])


failures = FailureAudit()
