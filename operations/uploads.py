"""Upload grants (spec/operator.md §2): a one-time credential that lets one agent push one file to the
server. ``mint``/``list``/``revoke`` are the operator's capabilities (MCP and REST); ``redeem``,
``write_chunk``, ``status``, ``commit`` and ``cancel`` serve the agent's HTTPS routes (operations.api), which
have no MCP twins. Only SHA-256 digests of the grant and session secrets are stored. Files land in
``YUZU_UPLOAD_DIR`` (default ``var/uploads``) as ``<retention_class>/<grant_id>``, mode 0600."""

import hashlib
import hmac
import os
import re
import secrets
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet.models import Agent
from fleet.services import visible_agents
from yuzu import rbac
from yuzu.audit import audit
from yuzu.errors import NotFound, YuzuError
from yuzu.plans import Plan

from .metrics import UPLOAD_BYTES, UPLOAD_EVENTS
from .models import UploadGrant, UploadSession, sha256_hex

SHA256_RE = re.compile(r"[0-9a-f]{64}")
GRANT_ID_RE = re.compile(r"[a-f0-9]{1,64}")
RANGE_RE = re.compile(r"bytes ([0-9]{1,15})-([0-9]{1,15})/([0-9]{1,15})")  # ASCII, and what int() reads
CHUNK_MAX = 4 * 1024 * 1024  # the server's request-body bound (DATA_UPLOAD_MAX_MEMORY_SIZE)


class Refused(Exception):
    """An agent-route refusal: HTTP status and the protocol's reason."""

    def __init__(self, status, reason, message, **extra):
        super().__init__(message)
        self.status, self.reason, self.message, self.extra = status, reason, message, extra


def storage_root():
    root = Path(getattr(settings, "YUZU_UPLOAD_DIR", None) or settings.VAR_DIR / "uploads")
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


def _path(grant):
    d = storage_root() / grant.retention_class
    d.mkdir(mode=0o700, exist_ok=True)
    return d / grant.grant_id


def invalid(message):
    return YuzuError(message, status=400, rpc_code=-32602)


# --- the operator's capabilities -----------------------------------------------------------------------

def plan_mint(principal, agent_id, declared_max_size, source_path="", expected_sha256="", retention_class="standard",
              ttl_secs=None):
    rbac.refuse_service_scoped(principal, "UploadGrant", "Write")
    if not rbac.has_any(principal, "UploadGrant", "Write"):
        raise rbac.denial(principal, "UploadGrant", "Write")
    if not isinstance(agent_id, str) or not 1 <= len(agent_id) <= 256:
        raise invalid("agent_id must be 1-256 characters")
    if not isinstance(declared_max_size, int) or isinstance(declared_max_size, bool) or declared_max_size < 1:
        raise invalid("declared_max_size must be an integer >= 1")
    if not isinstance(source_path, str) or len(source_path) > 4096 or "\x00" in source_path:
        raise invalid("source_path must be at most 4096 characters")
    if expected_sha256 and not (isinstance(expected_sha256, str) and SHA256_RE.fullmatch(expected_sha256)):
        raise invalid("expected_sha256 must be 64 lowercase hex characters (or empty)")
    if retention_class not in UploadGrant.RETENTION:
        raise invalid(f"retention_class must be one of {', '.join(UploadGrant.RETENTION)}")
    if ttl_secs is not None and (not isinstance(ttl_secs, int) or isinstance(ttl_secs, bool)):
        raise invalid("ttl_secs must be an integer")
    ttl = UploadGrant.TTL_DEFAULT_S if not ttl_secs or ttl_secs <= 0 else min(ttl_secs, UploadGrant.TTL_DEFAULT_S)
    if not Agent.objects.filter(pk=agent_id).exists() or \
            not visible_agents(principal, "UploadGrant", "Write").filter(pk=agent_id).exists():
        raise NotFound(f"unknown agent: agent {agent_id} not found")
    return Plan(summary=f"Let agent {agent_id} upload one file of at most {declared_max_size} bytes",
                value={"agent_id": agent_id, "declared_max_size": declared_max_size, "source_path": source_path,
                           "expected_sha256": expected_sha256 or "", "retention_class": retention_class, "ttl": ttl},
                pins={"agents": [agent_id]}, risk="additive")


def mint_upload_grant(principal, *, cid="", plan=None, **request):
    v = dict((plan or plan_mint(principal, **request)).value)
    ttl = v.pop("ttl")
    grant_id, secret = secrets.token_hex(16), secrets.token_hex(32)
    now = timezone.now()
    grant = UploadGrant.objects.create(grant_id=grant_id, secret_sha256=sha256_hex(secret), minted_by=principal.name,
                                       created_at=now, expires_at=now + timedelta(seconds=ttl), **v)
    audit(principal, "upload_grant.mint", "success", target_type="UploadGrant", target_id=grant_id,
          detail=f"agent_id={grant.agent_id} max={grant.declared_max_size} ttl={ttl}", correlation_id=cid)
    UPLOAD_EVENTS.labels("mint").inc()
    return {"grant_id": grant_id, "grant_secret": secret, "expires_at": grant.expires_at.isoformat(),
            "destination_key": grant.destination_key}


def list_upload_grants(principal):
    rbac.refuse_service_scoped(principal, "UploadGrant", "Read")
    if not rbac.has_any(principal, "UploadGrant", "Read"):
        raise rbac.denial(principal, "UploadGrant", "Read")
    qs = UploadGrant.objects.all()
    if rbac.group_scope(principal, "UploadGrant", "Read") is not None:
        qs = qs.filter(agent_id__in=visible_agents(principal, "UploadGrant", "Read").values("agent_id"))
    return {"data": [g.to_dict() for g in qs.order_by("-created_at")[:1000]]}


def plan_revoke(principal, grant_id, pinned=None):
    rbac.refuse_service_scoped(principal, "UploadGrant", "Delete")
    if not rbac.has_any(principal, "UploadGrant", "Delete"):
        raise rbac.denial(principal, "UploadGrant", "Delete")
    if not isinstance(grant_id, str) or not GRANT_ID_RE.fullmatch(grant_id):
        raise invalid("grant_id must be lowercase hex, at most 64 characters")
    qs = UploadGrant.objects.filter(pk=grant_id, state=UploadGrant.State.MINTED)
    if rbac.group_scope(principal, "UploadGrant", "Delete") is not None:
        qs = qs.filter(agent_id__in=visible_agents(principal, "UploadGrant", "Delete").values("agent_id"))
    grant = qs.first()
    if grant is None:
        raise NotFound(f"not_found: unredeemed upload grant {grant_id} not found")
    return Plan(summary=f"Revoke upload grant {grant_id} (agent {grant.agent_id})", value=grant_id,
                pins={"grant": grant_id}, risk="destructive")


def revoke_upload_grant(principal, grant_id=None, *, cid="", plan=None):
    grant_id = (plan or plan_revoke(principal, grant_id)).value
    changed = UploadGrant.objects.filter(pk=grant_id, state=UploadGrant.State.MINTED).update(
        state=UploadGrant.State.REVOKED)
    if not changed:
        raise NotFound(f"not_found: unredeemed upload grant {grant_id} not found")
    audit(principal, "upload_grant.revoke", "success", target_type="UploadGrant", target_id=grant_id,
          correlation_id=cid)
    UPLOAD_EVENTS.labels("revoke").inc()
    return {"revoked": True}


def stored_uploads():
    """Committed files with their hashes (the admin's list and docs)."""
    return [s.to_dict() for s in UploadSession.objects.filter(state=UploadSession.State.COMMITTED)
            .select_related("grant").order_by("-committed_at")[:1000]]


# --- the agent's routes --------------------------------------------------------------------------------

def _split(credential):
    grant_id, _, secret = (credential or "").partition(".")
    if not GRANT_ID_RE.fullmatch(grant_id) or not secret:
        raise Refused(401, "grant_unknown", "unknown upload grant")
    return grant_id, secret


def redeem(credential):
    """Atomic: one conditional UPDATE moves minted → redeemed, so a second redeem is refused (409)."""
    grant_id, secret = _split(credential)
    grant = UploadGrant.objects.filter(pk=grant_id).first()
    if grant is None or not hmac.compare_digest(grant.secret_sha256, sha256_hex(secret)):
        raise Refused(401, "grant_unknown", "unknown upload grant")
    now = timezone.now()
    if grant.state == UploadGrant.State.REVOKED:
        raise Refused(410, "expired", "the upload grant was revoked")
    if grant.state == UploadGrant.State.REDEEMED:
        audit(grant.agent_id, "upload_grant.session_open", "denied", target_type="UploadGrant", target_id=grant_id,
              detail="grant_already_redeemed")
        UPLOAD_EVENTS.labels("refused_redeemed").inc()
        raise Refused(409, "grant_already_redeemed", "the upload grant was already used")
    if grant.expires_at <= now:
        raise Refused(410, "expired", "the upload grant has expired")
    session_secret = secrets.token_hex(32)
    with transaction.atomic():
        if not UploadGrant.objects.filter(pk=grant_id, state=UploadGrant.State.MINTED).update(
                state=UploadGrant.State.REDEEMED):
            raise Refused(409, "grant_already_redeemed", "the upload grant was already used")
        session = UploadSession.objects.create(upload_id=secrets.token_hex(16), grant=grant,
                                               session_sha256=sha256_hex(session_secret),
                                               expires_at=now + timedelta(hours=1))
    path = _path(grant)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.close(fd)
    audit(grant.agent_id, "upload_grant.session_open", "success", target_type="UploadGrant", target_id=grant_id,
          detail=f"upload_id={session.upload_id}")
    UPLOAD_EVENTS.labels("session_open").inc()
    return {"upload_id": session.upload_id, "session_secret": session_secret, "chunk_max_bytes": CHUNK_MAX,
            "offset": 0, "expires_at": session.expires_at.isoformat()}


def _session(upload_id, credential, *, open_only=True):
    session = UploadSession.objects.select_related("grant").filter(pk=upload_id).first() \
        if isinstance(upload_id, str) and len(upload_id) <= 64 else None
    if session is None or not credential or not hmac.compare_digest(session.session_sha256, sha256_hex(credential)):
        raise Refused(401, "session_unknown", "unknown upload session")
    if open_only and session.state != UploadSession.State.OPEN:
        raise Refused(409, "session_terminal", f"the upload session is {session.state}")
    if open_only and session.expires_at <= timezone.now():
        raise Refused(410, "expired", "the upload session has expired")
    return session


def _fail(session, status, reason, message, **extra):
    UploadSession.objects.filter(pk=session.pk).update(state=UploadSession.State.FAILED)
    try:
        _path(session.grant).unlink()
    except FileNotFoundError:
        pass
    UPLOAD_EVENTS.labels(reason).inc()
    raise Refused(status, reason, message, **extra)


def write_chunk(upload_id, credential, content_range, body):
    session = _session(upload_id, credential)
    m = RANGE_RE.fullmatch(content_range or "")
    if not m:
        raise Refused(400, "bad_range", "Content-Range must be 'bytes start-end/total'")
    start, end, total = (int(x) for x in m.groups())
    if len(body) > CHUNK_MAX:
        raise Refused(413, "chunk_too_large", f"a chunk may carry at most {CHUNK_MAX} bytes")
    if total > session.grant.declared_max_size:
        _fail(session, 413, "size_exceeded", f"the file ({total} bytes) exceeds the grant's "
                                             f"{session.grant.declared_max_size} bytes; the session is ended")
    if total == 0 and not body:
        return {"offset": 0}
    if end < start or end - start + 1 != len(body) or end >= total:
        raise Refused(400, "bad_range", "Content-Range does not match the body")
    with transaction.atomic():
        locked = UploadSession.objects.select_for_update().get(pk=session.pk)
        if locked.offset != start:
            raise Refused(409, "offset_mismatch", f"the next chunk must start at {locked.offset}",
                          offset=locked.offset)
        with open(_path(session.grant), "r+b") as f:
            f.seek(start)
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        locked.offset = end + 1
        locked.save(update_fields=["offset"])
    UPLOAD_BYTES.inc(len(body))
    return {"offset": end + 1}


def status(upload_id, credential):
    session = _session(upload_id, credential, open_only=False)
    return {"state": session.state, "offset": session.offset, "expires_at": session.expires_at.isoformat()}


def commit(upload_id, credential, client_sha256):
    session = _session(upload_id, credential)
    path = _path(session.grant)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    actual, size = digest.hexdigest(), path.stat().st_size
    grant = session.grant
    if size != session.offset or not isinstance(client_sha256, str) or client_sha256 != actual or \
            (grant.expected_sha256 and grant.expected_sha256 != actual):
        _fail(session, 422, "hash_mismatch", "the upload's size or SHA-256 does not match")
    UploadSession.objects.filter(pk=session.pk).update(state=UploadSession.State.COMMITTED, sha256=actual,
                                                       actual_size=size, committed_at=timezone.now())
    audit(grant.agent_id, "upload_grant.commit", "success", target_type="UploadGrant", target_id=grant.grant_id,
          detail=f"upload_id={session.upload_id} size={size} sha256={actual}")
    UPLOAD_EVENTS.labels("commit").inc()
    return {"state": "committed", "actual_size": size, "sha256": actual, "destination_key": grant.destination_key}


def cancel(upload_id, credential):
    session = _session(upload_id, credential)
    UploadSession.objects.filter(pk=session.pk).update(state=UploadSession.State.CANCELLED)
    try:
        _path(session.grant).unlink()
    except FileNotFoundError:
        pass
    UPLOAD_EVENTS.labels("cancel").inc()
    return {"state": "cancelled"}
