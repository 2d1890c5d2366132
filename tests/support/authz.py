"""The authorization rules of yuzu, stated once, and a world real enough to check them against.

``expected(...)`` is THE table: for a caller (a role, held globally or on one management group), a token
tier and a target inside or outside the caller's group, what must a call answer? The MCP matrix
(tests/yuzu/test_authorization_matrix.py) asks it for every tool of both catalogues; the REST matrix for every
route. It is written from the product's rules (docs/tokens-and-rbac.md, docs/approvals.md), never from the
code under test:

1. **Tier first** (what each tier may call, ``tier_permits``): refused → ``tier`` (-32004 / 403).
2. **RBAC**: the caller's roles must grant the tool's ``Securable:Operation`` somewhere → else ``rbac``
   (-32003 / 403). A grant held on a management group counts only for the device-scoped securables
   (``GROUP_SCOPED``); AuditLog, ApiToken, UserManagement, InstructionDefinition, Bridge … need a global grant.
3. **Group confinement**: a target (agent, group, execution, ticket, token) the caller may not reach reads as
   absent → ``hidden`` (-32602 "not found" / 404) — exactly as an id that does not exist (no oracle).
4. A few capabilities need more than their own pair (``compound``): changing which devices a group holds needs
   a fleet-wide ManagementGroup:Write; a group's role assignments need a fleet-wide grant or ITServiceOwner on
   that group; a summary of an execution needs Execution:Read; reviewing is for humans in the admin only.
5. **Approval last**: what the tier gates (``tier_gates``) answers ``approval`` (-32006) with
   a ticket — only once everything above passed, so nothing a human could not run is put to one.
6. Otherwise ``allow``.

**Service scope** (docs/tokens-and-rbac.md, docs/security.md): a token scoped to one service (``Caller.service``)
reaches only the devices tagged ``service=<it>``. Before everything else, a capability that reaches further
(``Rule.service`` "denied": every tool but the "confined" ones, every REST route but their twins) refuses it →
``scope`` (-32003 / 403 naming ``scope_service``). A "confined" one then follows the table above — the scope
narrows the roles, never widens them (its service's device in another group stays out of a group-held role's
reach) — its device targets confined once more: another service's device (``SVC``, in the caller's own group)
reads exactly like one that does not exist — ``hidden``, before any ticket, or an empty result where an unknown
device gets one (``empty_when_absent``: the licence read, the inventory erase). Routes anyone may call ("open")
stay open to it; a review over REST answers every token approver_assurance_required, a scoped one too.
"""

from dataclasses import dataclass, field
from datetime import timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.contrib.auth import get_user_model
from django.utils import timezone

from approvals.gate import canonical_args
from approvals.models import Approval
from compliance.models import GuardRule, Policy, PolicyAgentStatus, PolicyFragment
from fleet.agent.plugins import catalogue as plugin_catalogue
from fleet.models import (
    Agent,
    AgentExecStatus,
    AgentInventory,
    AgentState,
    Execution,
    InstructionDefinition,
    ManagementGroup,
    Response,
    Tag,
)
from mcp.server import Request, handle
from operations import inventory
from operations.models import InstructionSchedule, PluginConfig, PluginSecret, UploadGrant
from pki import ca
from yuzu.models import AccountLockout, ApiToken
from yuzu.rbac import BUILTIN_ROLES, assign_role

TIERS = ("readonly", "operator", "supervised", "")  # "" = a token without a tier (REST / CLI)
GLOBAL_ROLES = ("Viewer", "Operator", "Approver", "Administrator", "ITServiceOwner", "PlatformEngineer", "Reviewer")
GROUP_ROLES = ("Viewer", "Operator", "Approver", "ITServiceOwner")  # Administrator is granted globally only
#: securables whose grants may be held on a management group (they concern devices, groups, or tickets
#: pinned to devices); any other securable needs a global grant.
GROUP_SCOPED = {"Infrastructure", "Tag", "Execution", "Response", "Security", "Inventory", "ManagementGroup",
                "Approval", "PluginConfig"}

ALLOW, TIER, RBAC, HIDDEN, APPROVAL, SCOPE = "allow", "tier", "rbac", "hidden", "approval", "scope"
IN, OUT, GHOST = "in", "out", "ghost"  # a target in the caller's group, in another group, or no such thing
#: a device of another service in the caller's group (for a service-scoped caller; IN and OUT are its service's)
SVC = "svc"
SERVICE, OTHER_SERVICE = "payments", "hr"


@dataclass(frozen=True)
class Caller:
    role: str | None
    on_group: bool = False  # the role is held on the "in" group only
    service: str = ""  # its tokens are scoped to this service

    @property
    def username(self):
        scoped = f"-{self.service}" if self.service else ""
        return f"{'g' if self.on_group else 'r'}-{(self.role or 'nobody').lower()}{scoped}"

    def grant(self, securable, operation):
        """None (not held), "global" or "group" — from the built-in role definitions, not from the database."""
        if self.role is None or (securable, operation) not in BUILTIN_ROLES[self.role][1]:
            return None
        if self.on_group:
            return "group" if securable in GROUP_SCOPED else None
        return "global"

    def __str__(self):
        scoped = f" service={self.service}" if self.service else ""
        return f"{self.role or 'no role'}{'@group' if self.on_group else ''}{scoped}"


CALLERS = ([Caller(r) for r in GLOBAL_ROLES] + [Caller(r, on_group=True) for r in GROUP_ROLES] + [Caller(None)])
#: service-scoped callers, a representative (caller, tier) each: the widest untiered token, the operator tier (its
#: gate on Tag:Delete), a group-held role on the supervised tier (its gates), a reader, and no role at all
SERVICE_PAIRS = [(Caller("Administrator", service=SERVICE), ""), (Caller("Operator", service=SERVICE), "operator"),
                 (Caller("ITServiceOwner", on_group=True, service=SERVICE), "supervised"),
                 (Caller("Viewer", service=SERVICE), "readonly"), (Caller(None, service=SERVICE), "readonly")]


@dataclass(frozen=True)
class Rule:
    """How one capability is confined. ``target``: which kind of object its arguments name (None: none);
    ``reach``: the (securable, operation) whose grant scope confines that target (default: the capability's
    own); ``compound``: an extra requirement, a function (caller, target) -> bool; ``rbac``: False when the
    capability has no RBAC gate of its own (a self-check, or one's own ticket)."""

    securable: str
    operation: str
    target: str | None = None
    reach: tuple | None = None
    compound: object = None
    rbac: bool = True
    human_only: bool = False
    also: tuple = ()  # further (securable, operation) pairs the caller must hold somewhere
    #: what a service-scoped token gets: "denied" (refused first), "confined" (kept to its service's devices) or
    #: "open" (a route anyone may call)
    service: str = "denied"
    #: a device the caller cannot reach answers an empty result (ALLOW), not "not found" (the licence reads)
    empty_when_absent: bool = False


def fleet_wide(securable, operation):
    return lambda caller, target: caller.grant(securable, operation) == "global"


def fleet_wide_or_owner(operation):
    """A group's role assignments: a fleet-wide ManagementGroup grant, or ITServiceOwner on that group."""
    return lambda caller, target: (caller.grant("ManagementGroup", operation) == "global"
                                   or (caller.role == "ITServiceOwner" and caller.on_group and target == IN))


def holds(securable, operation):
    return lambda caller, target: caller.grant(securable, operation) is not None


def reaches(rule, caller, target):
    """May the caller reach this target at all (else it reads as absent)?"""
    if target is None:
        return True
    if target in (GHOST, SVC):  # no such thing, or another service's device: alike (no oracle)
        return False
    kind = rule.target
    if kind == "own":  # one's own token / ticket: in = mine, out = someone else's
        return target == IN
    if kind == "token_admin":  # revoke: one's own, or anyone's with a fleet-wide UserManagement:Write
        return target == IN or caller.grant("UserManagement", "Write") == "global"
    if kind == "dispatched":  # a bundle, or cancelling an execution: its dispatcher (never the caller here)
        return caller.grant(*(rule.reach or (rule.securable, rule.operation))) == "global"  # or fleet-wide
    securable, operation = rule.reach or (rule.securable, rule.operation)
    scope = caller.grant(securable, operation)
    return scope == "global" or (scope == "group" and target == IN)


def expected(rule, tier, caller, target=None, face="mcp"):
    """THE table (see the module docstring). Over REST, an operation the tier gates is refused outright —
    an MCP token cannot get past an approval through the other face — before anything else is looked at.
    A service-scoped token is refused what is not confined to its service before even that — but a review over
    REST answers every token approver_assurance_required (docs/security.md, human-only review), a scoped one too."""
    if caller.service and rule.service == "denied" and not (face == "rest" and rule.human_only):
        return SCOPE
    if not tier_permits(tier, rule.securable, rule.operation):
        return TIER
    if face == "rest" and tier_gates(tier, rule.securable, rule.operation):
        return APPROVAL
    if rule.human_only:
        return RBAC
    if rule.rbac and caller.grant(rule.securable, rule.operation) is None:
        return RBAC
    if any(caller.grant(s, o) is None for s, o in rule.also):
        return RBAC
    if not reaches(rule, caller, target):
        return ALLOW if rule.empty_when_absent else HIDDEN
    if rule.compound is not None and not rule.compound(caller, target):
        return RBAC
    if tier_gates(tier, rule.securable, rule.operation):
        return APPROVAL
    return ALLOW


def targets(rule, caller):
    """The targets a row is called on for ``caller``: none, or in / out / ghost — and for a service-scoped caller a
    device row's another-service device too."""
    if rule.target is None:
        return (None,)
    if caller.service and rule.target == "agent":
        return (IN, OUT, SVC, GHOST)
    return (IN, OUT, GHOST)


# The tier policy as docs/tokens-and-rbac.md states it, restated here (not imported from yuzu.policy) so
# that a change to the code's table shows up as mismatches.
OPERATOR_MAY = {("Tag", "Write"), ("Tag", "Delete"), ("Execution", "Execute"), ("ApiToken", "Rotate"),
                ("Approval", "Write")}
SUPERVISED_GATES = {("Execution", "Execute"), ("Policy", "Write"), ("Policy", "Execute"), ("Security", "Write"),
                    ("Security", "Execute"),
                    ("UserManagement", "Write"), ("ManagementGroup", "Write"), ("ApiToken", "Write")}


def tier_permits(tier, securable, operation):
    if tier == "readonly":
        return operation == "Read"
    if tier == "operator":
        return operation == "Read" or (securable, operation) in OPERATOR_MAY
    return True  # supervised, or no tier at all


def tier_gates(tier, securable, operation):
    if tier == "operator":
        return (securable, operation) == ("Tag", "Delete")
    if tier == "supervised":
        return operation == "Delete" or (securable, operation) in SUPERVISED_GATES
    return False


# --- the world --------------------------------------------------------------------------------------

@dataclass
class World:
    """Two groups, an agent in each (connected, with the real plugin catalogue, tagged service=payments) and in the
    first another service's agent (SVC), a user per caller with a token per tier (scoped to the caller's service,
    if it has one), and someone else's executions, bundle, tickets and token to aim at."""

    agents: dict = field(default_factory=dict)  # IN/OUT/GHOST -> agent id
    groups: dict = field(default_factory=dict)  # IN/OUT/GHOST -> group id
    executions: dict = field(default_factory=dict)
    bundles: dict = field(default_factory=dict)
    tickets: dict = field(default_factory=dict)  # IN/OUT/GHOST -> someone else's ticket pinned there
    own_tickets: dict = field(default_factory=dict)  # username -> the caller's own pending ticket
    tokens: dict = field(default_factory=dict)  # (username, tier) -> (ApiToken, raw)
    other_token: str = ""
    users: dict = field(default_factory=dict)
    policies: dict = field(default_factory=dict)  # IN/OUT/GHOST -> policy id (not confined to groups)
    fragments: dict = field(default_factory=dict)  # IN/OUT/GHOST -> a fragment no policy uses
    rules: dict = field(default_factory=dict)  # IN/OUT/GHOST -> guard rule id
    cert: str = ""  # an active agent certificate's serial (the CA's certificates are fleet-wide: no in/out)
    grants: dict = field(default_factory=dict)  # IN/OUT/GHOST -> an unredeemed upload grant for that agent
    schedule: int = 0  # an instruction schedule (fleet-wide)
    engine: dict = field(default_factory=dict)  # governance: engine principals, a rotation in flight, a campaign

    def token_of(self, caller, tier):
        return self.tokens[(caller.username, tier)]


def _agent(agent_id, group, service=SERVICE):
    a = Agent.objects.create(agent_id=agent_id, hostname=f"{agent_id}.example", os="linux", arch="x86_64",
                             connected=True, last_seen=timezone.now(), credential_hash="0" * 64)
    Tag.objects.create(agent=a, key="owner", value="payments")
    Tag.objects.create(agent=a, key="service", value=service)
    AgentInventory.objects.create(agent=a, plugin=AgentInventory.CATALOGUE, data=plugin_catalogue())
    AgentInventory.objects.create(agent=a, plugin="os", data={"name": "linux"})
    group.members.add(a)
    return a


def _execution(dispatcher, agent, bundle_id=""):
    now = timezone.now()
    ex = Execution.objects.create(plugin="os", action="info", command_id=f"os-{agent.pk}-{bundle_id or 'x'}",
                                  dispatched_by=dispatcher, dispatched_at=now, expires_at=now + timedelta(minutes=5),
                                  agents_targeted=1, agents_responded=1, agents_success=1,
                                  status=Execution.Status.SUCCEEDED, completed_at=now, bundle_id=bundle_id,
                                  bundle_step=0 if bundle_id else None)
    AgentExecStatus.objects.create(execution=ex, agent=agent, status="success", exit_code=0)
    Response.objects.create(execution=ex, agent_id=agent.pk, instruction_id=ex.command_id, status=AgentState.SUCCESS,
                            output="linux", exit_code=0, timestamp=now, plugin="os")
    return ex


def ticket(submitter, agent_id, tool="delete_tag", args=None):
    args = args or {"agent_id": agent_id, "key": "owner"}
    return Approval.objects.create(definition_id=f"mcp.{tool}", submitted_by=submitter,
                                   scope_expression=canonical_args(args), summary=f"{tool} on {agent_id}",
                                   risk="destructive", pins={"agents": [agent_id]})


def fragment_yaml(name, fix=True):
    fix_step = "\n  fix: {plugin: script, action: run, parameters: {argv: 'true'}}" if fix else ""
    return (f"apiVersion: yuzu.io/v1alpha1\nkind: PolicyFragment\nmetadata: {{name: {name}}}\nspec:\n"
            f"  check: {{plugin: file, action: stat, parameters: {{path: /etc/passwd}}, "
            f"compliance: 'result.exists'}}{fix_step}\n")


def policy_yaml(name, fragment):
    return (f"apiVersion: yuzu.io/v1alpha1\nkind: Policy\nmetadata: {{name: {name}}}\nspec:\n"
            f"  fragment: {fragment}\n  triggers: [{{type: interval, interval_seconds: 300}}]\n")


def compliance_world(w, agents):
    """Two policies (with a fix, each non-compliant on one agent), two unused fragments, two guard rules."""
    PolicyFragment().apply_yaml(fragment_yaml("authz-fragment")).save()
    for target, agent in zip((IN, OUT), agents, strict=True):
        policy = Policy.from_yaml(policy_yaml(f"authz-policy-{target}", "authz-fragment"))
        PolicyAgentStatus.objects.create(policy=policy, agent=agent, status="non_compliant",
                                         last_check_at=timezone.now())
        w.policies[target] = policy.pk
        unused = PolicyFragment().apply_yaml(fragment_yaml(f"authz-unused-{target}"))
        unused.save()
        w.fragments[target] = unused.pk
        w.rules[target] = GuardRule.objects.create(name=f"authz-rule-{target}", spec_json={
            "spark": {"type": "file-change"}, "assertion": {"type": "file-exists", "params": {"path": "/etc/passwd"}},
            "remediation": {"type": "alert-only"}}).pk
    w.policies[GHOST] = w.fragments[GHOST] = w.rules[GHOST] = "0" * 8 + "-0000-4000-8000-" + "0" * 12


LICENCE = {"product": "rhel", "vendor": "Red Hat", "version": "9", "license_type": "subscription",
           "state": "subscription_active", "channel": "entitlement", "expiry_at": 1893456000,
           "detector": "entitlement_cert", "confidence": "authoritative", "key_hint": "ab12", "exe_hints": []}


def operations_world(w, agents):
    """A plugin configuration value and a secret to delete, an unredeemed upload grant per agent, and a detected
    licence and an installed package on each (so reading or erasing one shows)."""
    PluginConfig.objects.create(plugin="process", key="default_limit", value="50", updated_by="zed")
    from operations.models import SECRET_VALUE
    from yuzu import secrets

    PluginSecret.objects.create(scope_key="process.api_token", plugin="process", key="api_token",
                                sealed_value=secrets.seal("never-opened", SECRET_VALUE.where("process.api_token")),
                                updated_by="zed")
    for target, agent, grant_id in zip((IN, OUT, SVC), agents, ("a" * 32, "b" * 32, "c" * 32), strict=True):
        w.grants[target] = UploadGrant.objects.create(
            grant_id=grant_id, secret_sha256="0" * 64, agent_id=agent.pk, declared_max_size=10, minted_by="zed",
            expires_at=timezone.now() + timedelta(minutes=15)).pk
        inventory.receive_licenses(agent.pk, {"licenses": [LICENCE]})
        inventory.receive_software(agent.pk, {"hash": "b" * 64, "page": 0, "pages": 1, "packages": [
            {"name": "bash", "version": "5.1", "publisher": "", "install_date": "", "source": "dpkg"}]})
    w.grants[GHOST] = "f" * 32
    w.schedule = InstructionSchedule.objects.create(name="nightly", definition_id="def-1", frequency_type="daily",
                                                    time_of_day="02:00", created_by="zed", creator_key="u0.s").pk
def governance_world(w, owner):
    """Engine principals owned by zed: 'fresh' (no credential: mint), 'held' (one credential and the Viewer
    role: rotate, transfer, unassign), 'rot' (a rotation in flight: confirm, with its successor's secret), and
    an open access-review campaign. Engine principals and reviews are fleet-wide: no in/out targets.
    The KEK's first version is minutes old, so an allowed rotate_kek meets the rotation interval (cooldown)."""
    from governance import engines, reviews  # deferred: the governance app is optional to this module's readers
    from yuzu.plans import Plan
    from yuzu.rbac import Principal

    root = Principal(user=owner)
    for slug in ("fresh", "held", "rot"):
        engines.create_engine_principal(root, plan=Plan("", {
            "principal_id": f"engine:{slug}", "display_name": slug, "owner_username": owner.username,
            "justification": "the matrix", "classification": "internal"}))
    for slug in ("held", "rot"):
        engines.mint_engine_credential(root, plan=Plan("", (f"engine:{slug}", "c", 30)))
    engines.assign_engine_role(root, plan=Plan("", ("engine:held", "Viewer")))
    successor = engines.rotate_engine_credential(root, plan=Plan("", ("engine:rot", 7)))
    w.engine = {"successor": successor["token_id"], "secret": successor["raw_token"],
                "campaign": reviews.open_access_review(root, "the matrix")["campaign_id"]}


def build_world(callers=CALLERS, tiers=TIERS, pairs=()):
    """The world, with a token per caller and tier, and for each further (caller, tier) of ``pairs``."""
    User = get_user_model()
    w = World()
    g_in = ManagementGroup.objects.create(name="in-group")
    g_out = ManagementGroup.objects.create(name="out-group")
    w.groups = {IN: g_in.pk, OUT: g_out.pk, GHOST: "f" * 32}
    a_in, a_out, a_svc = _agent("in-1", g_in), _agent("out-1", g_out), _agent("in-2", g_in, OTHER_SERVICE)
    w.agents = {IN: a_in.pk, OUT: a_out.pk, GHOST: "ghost-1", SVC: a_svc.pk}
    zed = User.objects.create_user("zed")
    assign_role(zed, "Administrator")
    w.executions = {IN: _execution("zed", a_in).pk, OUT: _execution("zed", a_out).pk, GHOST: "e" * 32}
    _execution("zed", a_in, "bundle-in")
    _execution("zed", a_out, "bundle-out")
    w.bundles = {IN: "bundle-in", OUT: "bundle-out", GHOST: "bundle-ghost"}
    w.tickets = {IN: ticket("zed", a_in.pk).pk, OUT: ticket("zed", a_out.pk).pk, GHOST: "d" * 32}
    w.other_token = ApiToken.mint(zed, "zed-token")[0].pk
    w.cert = ca.issue_agent_cert(a_in.pk, ca.load_csr(csr_pem())).serial_hex
    locked = User.objects.create_user("locked-user")
    AccountLockout.objects.create(user=locked, failed_attempts=5, locked_until=timezone.now() + timedelta(minutes=15))
    InstructionDefinition.objects.create(id="def-1", name="OS info", plugin="os", action="info")
    compliance_world(w, (a_in, a_out))
    operations_world(w, (a_in, a_out, a_svc))
    governance_world(w, zed)
    expires = timezone.now() + timedelta(days=30)
    for caller, tier in [(c, t) for c in callers for t in tiers] + list(pairs):
        user = w.users.get(caller.username)
        if user is None:
            user = w.users[caller.username] = User.objects.create_user(caller.username)
            if caller.role:
                assign_role(user, caller.role, g_in if caller.on_group else None)
            w.own_tickets[caller.username] = ticket(caller.username, a_in.pk,
                                                    args={"agent_id": a_in.pk, "key": "mine"}).pk
        # Every caller's token is the successor of a rotation, so confirming it is a real, allowed call.
        old = ApiToken.mint(user, "old", mcp_tier=tier, expires_at=expires if tier else None,
                            scope_service=caller.service)[0]
        token, raw = ApiToken.mint(user, f"{caller.username}-{tier or 'untiered'}", mcp_tier=tier,
                                   expires_at=expires if tier else None, scope_service=caller.service)
        token.rotated_from = old
        token.save(update_fields=["rotated_from"])
        w.tokens[(caller.username, tier)] = (token, raw)
    return w


def csr_pem(curve=ec.SECP256R1):
    """A CSR for a fresh EC key (the key is thrown away: the matrix asks who may, not what is signed)."""
    key = ec.generate_private_key(curve())
    return (x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
            .public_bytes(serialization.Encoding.PEM).decode())


# --- calling mcp.server.handle in process ----------------------------------------------------------

def _headers(raw, sid=None):
    h = {"authorization": f"Bearer {raw}", "content-type": "application/json",
         "accept": "application/json, text/event-stream", "host": "127.0.0.1:8000"}
    if sid:
        h["mcp-session-id"] = sid
    return h


def open_session(raw, cat):
    msg = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
           "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "matrix", "version": "1"}}}
    reply = handle(Request("POST", _headers(raw), {}, cat, msg))
    assert reply.status == 200, reply.body
    return reply.headers.get("Mcp-Session-Id")

