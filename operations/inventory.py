"""The typed software inventory and detected licences (spec/operator.md §4–5): what agents report, stored
(full replace per agent in one transaction, hash-skip), and the two reads shared by the MCP tools and the
REST views. Confinement is admit-then-filter: rows of agents outside the caller's management groups are
dropped and counted (``devices_omitted``), and the omission is audited."""

import logging
import re
import threading
import time
from dataclasses import dataclass, field

from django.db import DatabaseError, transaction
from django.db.models import Count
from django.utils import timezone

from fleet.models import Agent
from fleet.services import in_service, visible_agents
from yuzu import rbac
from yuzu.audit import audit
from yuzu.errors import STORE_FAULT_RETRY_MS, YuzuError

from .metrics import SOFTWARE_SYNCS
from .models import DetectedLicense, InstalledSoftware, InventoryState

log = logging.getLogger("yuzu.operations")
SOURCES = ("dpkg", "rpm", "pacman", "pip", "npm")
MAX_PAGES = 64
MAX_ROWS = 20000
STAGE_TTL_S = 600  # a full list whose next page has not come for this long is dropped
HASH_RE = re.compile(r"[0-9a-f]{64}")
VERSION_PART_RE = re.compile(r"(\d+|[A-Za-z]+|~)")
MAX_VERSION = 128  # InstalledSoftware.version's length, and the tool schema's


@dataclass
class _Staging:
    """One agent's full list still arriving, in this process: its pages so far (or, once refused, none)."""

    digest: str
    pages: dict[int, list[dict[str, str]]] = field(default_factory=dict)
    rows: int = 0
    refused: bool = False  # over MAX_ROWS: the rest of this list is dropped as it comes
    touched: float = field(default_factory=time.monotonic)


_staged: dict[str, _Staging] = {}  # agent_id -> its list in progress (one per agent: a new hash replaces the old)
_staged_lock = threading.Lock()  # receivers run on database threads


class Malformed(ValueError):
    pass


def degraded():
    return YuzuError("Software inventory store degraded — query failed", status=503, rpc_code=-32603,
                     retry_after_ms=STORE_FAULT_RETRY_MS, remediation="retry shortly")


# --- what agents report ------------------------------------------------------------------------------

def _row(row, fields):
    if not isinstance(row, dict):
        raise Malformed("a row must be an object")
    out = {}
    for key, limit in fields.items():
        value = row.get(key, "")
        if not isinstance(value, str) or len(value) > limit or "\x00" in value:
            raise Malformed(f"'{key}' must be text of at most {limit} characters")
        out[key] = value
    return out


PACKAGE_FIELDS = {"name": 256, "version": 128, "publisher": 256, "install_date": 32, "source": 16}


def receive_software(agent_id, report):
    """A ``software`` report: a hash alone (nothing changed), or one page of a full list. Returns the frame
    to push back (``software.resync`` when the hash cannot be matched), or None."""
    digest = report.get("hash")
    if not isinstance(digest, str) or not HASH_RE.fullmatch(digest):
        raise Malformed("'hash' must be 64 lowercase hex characters")
    now = timezone.now()
    if "packages" not in report:
        touched = InventoryState.objects.filter(agent_id=agent_id, source="software", content_hash=digest).update(
            last_seen=now)
        SOFTWARE_SYNCS.labels("software", "hash_match" if touched else "resync").inc()
        return None if touched else {"type": "software.resync"}
    page, pages, packages = report.get("page"), report.get("pages"), report.get("packages")
    if not (isinstance(page, int) and isinstance(pages, int) and 0 <= page < pages <= MAX_PAGES
            and isinstance(packages, list)):
        raise Malformed("'page' and 'pages' must be integers (page < pages <= 64) and 'packages' a list")
    rows = [_row(r, PACKAGE_FIELDS) for r in packages]
    if any(r["source"] not in SOURCES or not r["name"] for r in rows):
        raise Malformed(f"every package needs a name and a source of {', '.join(SOURCES)}")
    everything = _stage(agent_id, digest, page, pages, rows)
    if everything is None:
        return None
    with transaction.atomic():
        InstalledSoftware.objects.filter(agent_id=agent_id).delete()
        InstalledSoftware.objects.bulk_create([InstalledSoftware(agent_id=agent_id, **r) for r in everything],
                                              batch_size=1000)
        state, created = InventoryState.objects.get_or_create(
            agent_id=agent_id, source="software", defaults={"content_hash": digest, "rows": len(everything)})
        if not created:
            state.content_hash, state.last_seen, state.rows = digest, now, len(everything)
            state.save(update_fields=["content_hash", "last_seen", "rows"])
    SOFTWARE_SYNCS.labels("software", "full").inc()
    return None


def _stage(agent_id, digest, page, pages, rows):
    """Keep one page of an agent's full list; the whole list once its last page came, else None. Bounded while it
    arrives: a list over MAX_ROWS is refused (logged, counted ``too_many_rows``) and the rest of it dropped as it
    comes; a list not continued for STAGE_TTL_S is dropped (``expired``); so is the agent's on disconnect."""
    now = time.monotonic()
    with _staged_lock:
        for stale in [a for a, s in _staged.items() if now - s.touched > STAGE_TTL_S]:
            _drop(stale, "expired")
        staging = _staged.get(agent_id)
        if staging is None or staging.digest != digest:  # a new list replaces one this agent never finished
            if staging is not None and not staging.refused:
                SOFTWARE_SYNCS.labels("software", "abandoned").inc()
            staging = _staged[agent_id] = _Staging(digest)
        staging.touched = now
        if staging.refused:
            return None
        staging.rows += len(rows) - len(staging.pages.get(page, ()))
        if staging.rows > MAX_ROWS:
            staging.refused, staging.pages = True, {}
            SOFTWARE_SYNCS.labels("software", "too_many_rows").inc()
            log.warning("refused the software list of agent %s: more than %d packages (page %d of %d); nothing "
                        "stored, its rows kept as they were", agent_id, MAX_ROWS, page + 1, pages)
            return None
        staging.pages[page] = rows
        if len(staging.pages) < pages:
            return None
        del _staged[agent_id]
        return [r for i in range(pages) for r in staging.pages.get(i, [])]


def _drop(agent_id, outcome):
    staging = _staged.pop(agent_id, None)
    if staging is not None and not staging.refused:
        SOFTWARE_SYNCS.labels("software", outcome).inc()
        log.info("dropped %d staged software page(s) of agent %s (%s)", len(staging.pages), agent_id, outcome)


def forget_staged(agent_id):
    """The agent's connection closed: its unfinished list will never be completed here."""
    with _staged_lock:
        _drop(agent_id, "abandoned")


LICENSE_FIELDS = {"product": 256, "vendor": 256, "version": 128, "license_type": 16, "state": 24, "channel": 64,
                  "detector": 24, "confidence": 16, "key_hint": 32}


def receive_licenses(agent_id, report):
    items = report.get("licenses")
    if not isinstance(items, list) or len(items) > 5000:
        raise Malformed("'licenses' must be a list of at most 5000 records")
    rows = []
    for item in items:
        row = _row(item, LICENSE_FIELDS)
        if row["license_type"] not in DetectedLicense.TYPES or row["state"] not in DetectedLicense.STATES or \
                row["detector"] not in DetectedLicense.DETECTORS or row["confidence"] not in DetectedLicense.CONFIDENCES:
            raise Malformed("a licence record has a type, state, detector or confidence outside the vocabulary")
        expiry = item.get("expiry_at", 0)
        hints = item.get("exe_hints", [])
        if not isinstance(expiry, int) or isinstance(expiry, bool) or not 0 <= expiry < 2**40 or \
                not isinstance(hints, list) or len(hints) > 16 or not all(isinstance(h, str) and len(h) <= 256
                                                                         for h in hints):
            raise Malformed("'expiry_at' must be epoch seconds and 'exe_hints' at most 16 short strings")
        rows.append(DetectedLicense(agent_id=agent_id, expiry_at=expiry, exe_hints=hints, **row))
    with transaction.atomic():
        DetectedLicense.objects.filter(agent_id=agent_id).delete()
        DetectedLicense.objects.bulk_create(rows, batch_size=1000)
        InventoryState.objects.update_or_create(agent_id=agent_id, source="license_scan",
                                                defaults={"content_hash": "", "last_seen": timezone.now(),
                                                          "rows": len(rows)})
    SOFTWARE_SYNCS.labels("license_scan", "full").inc()


# --- version comparison ------------------------------------------------------------------------------

def version_key(version):
    """A dpkg-like ordering key: epoch, then runs of digits compared as numbers and of letters as text, '~'
    sorting before everything (1.0~rc1 < 1.0)."""
    epoch, _, rest = version.rpartition(":") if ":" in version else ("0", "", version)
    parts = []
    for token in VERSION_PART_RE.findall(rest):
        if token == "~":
            parts.append((-1, 0, ""))
        elif token.isdigit():
            parts.append((1, int(token), ""))
        else:
            parts.append((0, 0, token))
    parts.append((0, -1, ""))  # a shorter version sorts before a longer one with the same prefix
    return (int(epoch) if epoch.isdecimal() else 0, parts)  # isdigit() admits "²", which int() refuses


COMPARATORS = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "eq": lambda a, b: a == b,
               "ge": lambda a, b: a >= b, "gt": lambda a, b: a > b, "ne": lambda a, b: a != b}


# --- the reads ---------------------------------------------------------------------------------------

def query_installed_software(principal, *, name=None, agent_id=None, version=None, version_op=None,
                             source=None, limit=100, counts=False, cid=""):
    if not rbac.has_any(principal, "Inventory", "Read"):
        raise rbac.denial(principal, "Inventory", "Read")
    if (version is None) != (version_op is None):
        raise YuzuError("version and version_op go together", remediation="e.g. version_op=lt version=3.0.2")
    if version is not None and (not isinstance(version, str) or len(version) > MAX_VERSION):
        # the tool's schema says so; the REST twin's query parameter has no schema (a run of over 4,300 digits
        # made version_key's int() raise: a 500)
        raise YuzuError(f"version must be text of at most {MAX_VERSION} characters",
                        remediation="a package version as the agents report it, e.g. 3.0.2-0ubuntu1")
    try:
        qs = InstalledSoftware.objects.all()
        if name:
            qs = qs.filter(name=name)
        if agent_id:
            qs = qs.filter(agent_id=agent_id)
        if source:
            qs = qs.filter(source=source)
        confined = rbac.group_scope(principal, "Inventory", "Read") is not None or principal.scope_service
        mine = set(visible_agents(principal, "Inventory", "Read").values_list("agent_id", flat=True)) \
            if confined else None
        rows, omitted, truncated, scanned = [], set(), False, 0
        cap = 1000 * 50 if version_op or counts else limit + 1
        wanted = version_key(version) if version is not None else None
        for row in qs.order_by("agent_id", "name", "version")[:cap].iterator():
            scanned += 1
            if mine is not None and row.agent_id not in mine:
                omitted.add(row.agent_id)
                continue
            if wanted is not None and not COMPARATORS[version_op](version_key(row.version), wanted):
                continue
            rows.append(row)
        truncated = scanned >= cap
    except DatabaseError:
        raise degraded() from None
    out = {"software": [r.to_dict() for r in rows[:limit]], "count": min(len(rows), limit)}
    if len(rows) > limit or truncated:
        out["result_truncated_by_cap"] = True
    if counts:
        per = {}
        for r in rows:
            per[(r.name, r.version)] = per.get((r.name, r.version), 0) + 1
        out["versions"] = [{"name": n, "version": v, "devices": c}
                           for (n, v), c in sorted(per.items(), key=lambda kv: (kv[0][0], version_key(kv[0][1])))]
    if omitted:
        out["devices_omitted"] = len(omitted)
        persisted = audit(principal, "inventory.software.query", "denied", target_type="InstalledSoftware",
                          target_id=name or "", detail=f"devices_omitted={len(omitted)}", correlation_id=cid)
        if not persisted:
            out["audit_persisted"] = False
    return out


def software_summary():
    """For the admin and metrics: packages and agents reported."""
    return InstalledSoftware.objects.aggregate(rows=Count("id"), agents=Count("agent", distinct=True))


def query_software_licenses(principal, agent_id, *, cid="", with_user=False, surface="mcp"):
    """Checked per device: an agent outside the caller's groups is -32003. An unknown agent, or one outside a
    service-scoped token's service, reads alike: no records."""
    known = in_service(principal, Agent.objects.filter(pk=agent_id)).exists()  # another service's: unknown
    if known and not rbac.may(principal, "SoftwareLicensing", "Read", agent=agent_id):
        raise rbac.denial(principal, "SoftwareLicensing", "Read", agent=agent_id)
    if not known and not rbac.has_any(principal, "SoftwareLicensing", "Read"):
        raise rbac.denial(principal, "SoftwareLicensing", "Read")
    persisted = audit(principal, "sle.agent.view", "success", target_type="Agent", target_id=agent_id,
                      correlation_id=cid)
    if not persisted and surface == "rest":
        raise YuzuError("the audit row could not be stored", status=503, rpc_code=-32603,
                        retry_after_ms=STORE_FAULT_RETRY_MS)
    try:
        rows = list(DetectedLicense.objects.filter(agent_id=agent_id).order_by("product")[:5000]) if known else []
    except DatabaseError:
        raise degraded() from None
    out = {"agent_id": agent_id, "count": len(rows), "licenses": [r.to_dict(with_user) for r in rows]}
    if not persisted:
        out["audit_persisted"] = False
    return out


def decommission_agent_inventory(principal, agent_id, *, cid=""):
    """DELETE /sle/agents/{id}: SoftwareLicensing, Inventory and GuaranteedState Delete on the device; audit
    first (fail closed), then erase every per-agent inventory store. A device outside a service-scoped token's
    service answers as an unknown one (docs/operator.md): the grants alone decide, and nothing is erased."""
    outside = bool(principal.scope_service) and not in_service(principal, Agent.objects.filter(pk=agent_id)).exists()
    for securable in ("SoftwareLicensing", "Inventory", "GuaranteedState"):
        if not rbac.may(principal, securable, "Delete", agent=None if outside else agent_id):
            raise rbac.denial(principal, securable, "Delete", agent=agent_id)
    if not audit(principal, "sle.agent.decommission", "success", target_type="Agent", target_id=agent_id,
                 correlation_id=cid):
        raise YuzuError("the audit row could not be stored; nothing was erased", status=503, rpc_code=-32603,
                        retry_after_ms=STORE_FAULT_RETRY_MS)
    if outside:
        return {"agent_id": agent_id, "erased_rows": 0}
    with transaction.atomic():
        n = DetectedLicense.objects.filter(agent_id=agent_id).delete()[0]
        n += InstalledSoftware.objects.filter(agent_id=agent_id).delete()[0]
        n += InventoryState.objects.filter(agent_id=agent_id).delete()[0]
    return {"agent_id": agent_id, "erased_rows": n}
