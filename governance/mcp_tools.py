"""Governance MCP tools (spec/governance.md): engine principals (12), access reviews (6), the KEK (3). Thin
handlers over governance.engines / .reviews / .kek, which the REST views (governance.api) call too."""

from mcp.registry import tool
from mcp.schema import APPROVAL_ID, array, boolean, enum, integer, nullable, obj, string

from . import engines, kek, reviews
from .models import AccessReviewAttestation as Att

GATED = " Approval-gated on the supervised tier: the first call answers -32006 with an approval_id."
DENY_ENGINE = " An engine principal's own credential is refused (structural denial)."
PRINCIPAL_ID = string(128, "Engine principal id, e.g. engine:patch-bot", minLength=1,
                      pattern="^engine:[a-z0-9._-]+$")
SLUG = string(120, "Engine principal id WITHOUT the 'engine:' prefix (bare slug)", minLength=1,
              pattern="^[a-z0-9._-]+$")
ROLE = string(64, "Role name (an existing role)", minLength=1)
IDENTITY = {"principal_id": string(128), "display_name": string(256), "owner_username": string(150),
            "justification": string(2048), "classification": enum(("internal", "external")),
            "lifecycle_state": enum(("active", "revoked")), "superseded_by": nullable(string(128)),
            "created_at": integer(), "revoked_at": nullable(integer()), "created_by": string(150),
            "active_credentials": integer(0), "rotation": nullable(obj(additional=True))}
ROW = obj(IDENTITY, ["principal_id", "lifecycle_state", "active_credentials"], additional=True)
UUID = string(36, "Campaign id (uuid)", minLength=1)
CAMPAIGN = obj({"campaign_id": string(36), "title": string(256), "status": enum(("open", "closed")),
                "created_by": string(150), "created_at_ms": integer(), "closed_by": nullable(string(150)),
                "closed_at_ms": nullable(integer()), "grant_count": integer(0),
                "revocations_applied": integer(0)}, ["campaign_id", "status"], additional=True)



# --- engine principals ------------------------------------------------------------------------------

@tool(name="create_engine_principal", title="Create an engine principal", securable="Security", operation="Write",
      effect="additive", idempotent=False,
      prepare=lambda ctx, a, pinned=None: engines.plan_create_engine_principal(ctx.principal, a, pinned),
      description="Register a new engine principal (autonomous-module identity) with a human owner and "
                  "justification; needs approval. It holds no authority until a role is assigned and no credential "
                  "until one is minted. Ids are never reused." + GATED + DENY_ENGINE,
      input_schema=obj({"principal_id": PRINCIPAL_ID,
                        "display_name": string(256, "Human-readable name", minLength=1),
                        "owner_username": string(150, "The accountable human (an existing user)", minLength=1),
                        "justification": string(2048, "Why it exists (audited)", minLength=1),
                        "classification": enum(("internal", "external"), "Where the module runs"),
                        "approval_id": APPROVAL_ID},
                       ["principal_id", "display_name", "owner_username", "justification", "classification"]),
      output_schema=obj({k: IDENTITY[k] for k in ("principal_id", "display_name", "owner_username", "classification",
                                                  "lifecycle_state", "created_at")},
                        ["principal_id", "lifecycle_state"]))
def create_engine_principal(ctx, args):
    return engines.create_engine_principal(ctx.principal, cid=ctx.cid, plan=ctx.plan)


@tool(name="list_engine_principals", title="List engine principals", securable="EnginePrincipal", operation="Read",
      description="List engine principals and how many active credentials each holds. An empty list means none "
                  "is registered." + DENY_ENGINE,
      input_schema=obj({"include_revoked": boolean("Include revoked principals (default true)")}),
      output_schema=obj({"count": integer(0), "principals": array(ROW)}, ["count", "principals"]))
def list_engine_principals(ctx, args):
    return engines.list_engine_principals(ctx.principal, args.get("include_revoked", True))


@tool(name="get_engine_principal", title="Get an engine principal", securable="EnginePrincipal", operation="Read",
      description="Show one engine principal's identity record and active credential count (and the rotation in "
                  "flight, if any). An unknown id is -32602 'engine principal not found'." + DENY_ENGINE,
      input_schema=obj({"principal_id": PRINCIPAL_ID}, ["principal_id"]), output_schema=ROW)
def get_engine_principal(ctx, args):
    return engines.get_engine_principal(ctx.principal, args["principal_id"])


@tool(name="revoke_engine_principal", title="Revoke an engine principal", securable="Security", operation="Write",
      effect="destructive", idempotent=True,
      prepare=lambda ctx, a, pinned=None: engines.plan_revoke_engine_principal(
          ctx.principal, a["principal_id"], a.get("reason", ""), a.get("superseded_by", ""), pinned),
      description="Permanently retire an engine principal and every credential it holds; irreversible, needs "
                  "approval. Credentials are revoked first, then the state flips; an already-revoked principal is a "
                  "no-op success." + GATED + DENY_ENGINE,
      input_schema=obj({"principal_id": PRINCIPAL_ID, "reason": string(1024, "Why (audited)"),
                        "superseded_by": string(128, "The principal replacing it, if any",
                                                pattern="^(engine:[a-z0-9._-]+)?$"),
                        "approval_id": APPROVAL_ID}, ["principal_id"]),
      output_schema=obj({"revoked": boolean(), "principal_id": string(128), "credentials_revoked": integer(0)},
                        ["revoked", "principal_id", "credentials_revoked"]))
def revoke_engine_principal(ctx, args):
    return engines.revoke_engine_principal(ctx.principal, cid=ctx.cid, plan=ctx.plan)


@tool(name="mint_engine_credential", title="Mint an engine credential", securable="Security", operation="Write",
      effect="additive", idempotent=False,
      prepare=lambda ctx, a, pinned=None: engines.plan_mint_engine_credential(
          ctx.principal, a["principal_id"], a.get("name", ""), a.get("ttl_days", 90), pinned),
      description="Issue the first read-only credential for an engine principal; the secret is shown once; needs "
                  "approval. Refused while the principal holds any active credential (rotate instead). The "
                  "credential is an MCP token locked to the readonly tier." + GATED + DENY_ENGINE,
      input_schema=obj({"principal_id": PRINCIPAL_ID, "name": string(256, "Label"),
                        "ttl_days": integer(1, 90, "Lifetime in days (default 90)"),
                        "approval_id": APPROVAL_ID}, ["principal_id"]),
      output_schema=obj({"token_id": string(24), "raw_token": string(128), "principal_id": string(128),
                         "expires_at": integer()}, ["token_id", "raw_token", "principal_id", "expires_at"]))
def mint_engine_credential(ctx, args):
    return engines.mint_engine_credential(ctx.principal, cid=ctx.cid, plan=ctx.plan)


@tool(name="rotate_engine_credential", title="Rotate an engine credential", securable="Security",
      operation="Write", effect="additive", idempotent=False,
      prepare=lambda ctx, a, pinned=None: engines.plan_rotate_engine_credential(
          ctx.principal, a["principal_id"], a.get("overlap_days", 7), pinned),
      description="Start an overlap rotation: issue a successor credential while the old one keeps working; needs "
                  "approval. The same caller retrying within 120 s gets the same successor secret again (each "
                  "reveal is audited). Refused with no credential, or with 2 already active." + GATED + DENY_ENGINE,
      input_schema=obj({"principal_id": PRINCIPAL_ID,
                        "overlap_days": integer(1, 3650, "How long the old credential keeps working (default 7)"),
                        "approval_id": APPROVAL_ID}, ["principal_id"]),
      output_schema=obj({"token_id": string(24), "raw_token": string(128), "principal_id": string(128),
                         "overlap_expires_at": integer()}, ["token_id", "raw_token", "principal_id"]))
def rotate_engine_credential(ctx, args):
    return engines.rotate_engine_credential(ctx.principal, cid=ctx.cid, plan=ctx.plan)


@tool(name="confirm_engine_rotation", title="Confirm an engine credential rotation", securable="Security",
      operation="Write", effect="destructive", idempotent=False,
      prepare=lambda ctx, a, pinned=None: engines.plan_confirm_engine_rotation(
          ctx.principal, a["principal_id"], a["token_id"], a["secret"], pinned),
      precondition=lambda ctx, a: engines.rotation_confirmable(a["principal_id"], a["token_id"]),
      description="Confirm the consumer installed the rotated secret, which revokes the old credential; needs "
                  "approval. token_id and secret are the successor's (proof of possession; a wrong secret is "
                  "-32003, checked last). On an approved recall the live rotation state is re-read before the "
                  "ticket is consumed: if it no longer fits, the ticket stays valid. Replaying a resolved "
                  "confirmation is -32602 'rotation already confirmed'." + GATED + DENY_ENGINE,
      input_schema=obj({"principal_id": PRINCIPAL_ID,
                        "token_id": string(24, "The successor's token id", pattern="^[0-9a-f]{24}$"),
                        "secret": string(512, "The successor's raw secret", minLength=1),
                        "approval_id": APPROVAL_ID}, ["principal_id", "token_id", "secret"]),
      output_schema=obj({"confirmed": boolean(), "principal_id": string(128)}, ["confirmed", "principal_id"]))
def confirm_engine_rotation(ctx, args):
    return engines.confirm_engine_rotation(ctx.principal, cid=ctx.cid, plan=ctx.plan)


@tool(name="transfer_engine_principal_owner", title="Transfer an engine principal", securable="Security",
      operation="Write", effect="additive", idempotent=True,
      prepare=lambda ctx, a, pinned=None: engines.plan_transfer_engine_principal_owner(
          ctx.principal, a["principal_id"], a["new_owner"], pinned),
      description="Hand an engine principal to a different responsible owner; needs approval. The new owner must "
                  "be an existing, active user." + GATED + DENY_ENGINE,
      input_schema=obj({"principal_id": PRINCIPAL_ID, "new_owner": string(150, "Username", minLength=1),
                        "approval_id": APPROVAL_ID}, ["principal_id", "new_owner"]),
      output_schema=obj({"transferred": boolean(), "principal_id": string(128), "new_owner": string(150)},
                        ["transferred", "principal_id", "new_owner"]))
def transfer_engine_principal_owner(ctx, args):
    return engines.transfer_engine_principal_owner(ctx.principal, cid=ctx.cid, plan=ctx.plan)


@tool(name="audit_engine_no_admin", title="Prove engines hold no admin", securable="AuditLog", operation="Read",
      description="Prove that no engine principal holds admin or admin-equivalent permissions. ok:true with no "
                  "violations is the proof (an empty violations list means no engine principal holds admin); an unreadable RBAC catalogue is -32603 'unable to verify', never "
                  "ok:true." + DENY_ENGINE,
      input_schema=obj({"include_revoked": boolean("Check revoked principals too (default true)")}),
      output_schema=obj({"ok": boolean(), "violations": array(obj({
          "principal_id": string(128), "role": nullable(string(64)),
          "reason": enum(("admin_role", "system_role", "wildcard_equivalent"))}, ["principal_id", "reason"]))},
          ["ok", "violations"]))
def audit_engine_no_admin(ctx, args):
    return engines.audit_engine_no_admin(ctx.principal, args.get("include_revoked", True))


@tool(name="assign_engine_role", title="Assign a role to an engine principal", securable="Security",
      operation="Write", effect="additive", idempotent=True,
      prepare=lambda ctx, a, pinned=None: engines.plan_assign_engine_role(ctx.principal, a["principal_id"],
                                                                          a["role"], pinned),
      description="Grant an existing non-admin role to an engine principal fleet-wide; needs approval. "
                  "Administrator, or any role granting every permission, is refused (never narrowed)."
                  + GATED + DENY_ENGINE,
      input_schema=obj({"principal_id": SLUG, "role": ROLE, "approval_id": APPROVAL_ID}, ["principal_id", "role"]),
      output_schema=obj({"assigned": boolean(), "principal_id": string(128), "role": string(64)},
                        ["assigned", "principal_id", "role"]))
def assign_engine_role(ctx, args):
    return engines.assign_engine_role(ctx.principal, cid=ctx.cid, plan=ctx.plan)


@tool(name="unassign_engine_role", title="Remove a role from an engine principal", securable="Security",
      operation="Write", effect="destructive", idempotent=True,
      prepare=lambda ctx, a, pinned=None: engines.plan_unassign_engine_role(ctx.principal, a["principal_id"],
                                                                            a["role"], pinned),
      description="Remove a role from an engine principal; needs approval. A role it does not hold is -32602."
                  + GATED + DENY_ENGINE,
      input_schema=obj({"principal_id": SLUG, "role": ROLE, "approval_id": APPROVAL_ID}, ["principal_id", "role"]),
      output_schema=obj({"unassigned": boolean(), "principal_id": string(128), "role": string(64)},
                        ["unassigned", "principal_id", "role"]))
def unassign_engine_role(ctx, args):
    return engines.unassign_engine_role(ctx.principal, cid=ctx.cid, plan=ctx.plan)


@tool(name="list_engine_roles", title="List an engine principal's roles", securable="EnginePrincipal",
      operation="Read",
      description="List the roles currently assigned to an engine principal. An empty list means it holds no "
                  "authority at all." + DENY_ENGINE,
      input_schema=obj({"principal_id": SLUG}, ["principal_id"]),
      output_schema=obj({"principal_id": string(128), "count": integer(0),
                         "roles": array(obj({"principal_id": string(128), "role": string(64)}))},
                        ["principal_id", "count", "roles"]))
def list_engine_roles(ctx, args):
    return engines.list_engine_roles(ctx.principal, args["principal_id"])


# --- access reviews ---------------------------------------------------------------------------------

EXPORT_ROW = obj({"principal_type": string(8), "principal_id": string(150), "roles": array(string(200))},
                 additional=True)


@tool(name="export_access_review", title="Export access-review evidence", securable="AccessReview",
      operation="Read",
      description="Export every principal's current direct role grants as access-review evidence (one row per "
                  "principal holding at least one grant), or a campaign's frozen rows and decisions with "
                  "campaign_id; sha256 is the SHA-256 of the rows' canonical JSON (sorted keys, compact) for an "
                  "auditor to verify. An empty rows list means no principal holds a direct grant (or the campaign froze "
                  "none). CSV: REST ?format=csv." + DENY_ENGINE,
      input_schema=obj({"campaign_id": UUID}),
      output_schema=obj({"count": integer(0), "rows": array(EXPORT_ROW), "sha256": string(64),
                         "generated_at_ms": integer(), "campaign": CAMPAIGN}, ["count", "rows", "sha256"]))
def export_access_review(ctx, args):
    return reviews.export_access_review(ctx.principal, args.get("campaign_id"), cid=ctx.cid)


@tool(name="open_access_review", title="Open an access review", securable="AccessReview", operation="Attest",
      effect="additive", idempotent=False,
      description="Open a review campaign that freezes the current grant population for attestation: one pending "
                  "row per (principal, role) grant. Grants added later are out of scope; grants removed later stay "
                  "reviewable." + DENY_ENGINE,
      input_schema=obj({"title": string(256, "What this review is", minLength=1)}, ["title"]),
      output_schema=obj({"campaign_id": string(36), "grant_count": integer(0)}, ["campaign_id", "grant_count"]))
def open_access_review(ctx, args):
    return reviews.open_access_review(ctx.principal, args["title"], cid=ctx.cid)


@tool(name="record_attestation", title="Record an attestation", securable="AccessReview", operation="Attest",
      effect="destructive", idempotent=True,
      description="Record a reviewer's attest or flag-for-revoke decision on one frozen grant (overwrites the "
                  "previous decision). It never changes the grant itself: closing the campaign applies the flagged "
                  "revocations. role_name is 'Role' for a fleet-wide grant, 'Role@<group>' for one held on a "
                  "management group." + DENY_ENGINE,
      input_schema=obj({"campaign_id": UUID, "principal_type": enum(Att.PrincipalType.values),
                        "principal_id": string(150, minLength=1), "role_name": string(200, minLength=1),
                        "decision": enum((Att.Decision.ATTESTED, Att.Decision.FLAGGED_REVOKE)),
                        "justification": string(2048, "Why (kept as evidence)")},
                       ["campaign_id", "principal_type", "principal_id", "role_name", "decision"]),
      output_schema=obj({"recorded": boolean()}, ["recorded"]))
def record_attestation(ctx, args):
    return reviews.record_attestation(ctx.principal, args["campaign_id"], args["principal_type"],
                                      args["principal_id"], args["role_name"], args["decision"],
                                      args.get("justification", ""), cid=ctx.cid)


@tool(name="get_access_review", title="Get an access review", securable="AccessReview", operation="Read",
      description="Show a campaign with every attestation row and the pending count. An empty attestations list "
                  "means the campaign froze no grants." + DENY_ENGINE,
      input_schema=obj({"campaign_id": UUID}, ["campaign_id"]),
      output_schema=obj({"campaign": CAMPAIGN, "attestations": array(obj(additional=True)),
                         "pending_count": integer(0)}, ["campaign", "attestations", "pending_count"]))
def get_access_review(ctx, args):
    return reviews.get_access_review(ctx.principal, args["campaign_id"], cid=ctx.cid)


@tool(name="list_access_reviews", title="List access reviews", securable="AccessReview", operation="Read",
      description="List review campaigns, newest first (at most 500). An empty list means none was opened."
                  + DENY_ENGINE,
      input_schema=obj({}),
      output_schema=obj({"count": integer(0), "campaigns": array(CAMPAIGN)}, ["count", "campaigns"]))
def list_access_reviews(ctx, args):
    return reviews.list_access_reviews(ctx.principal, cid=ctx.cid)


@tool(name="close_access_review", title="Close an access review", securable="AccessReview", operation="Attest",
      effect="destructive", idempotent=False,
      description="Close a review campaign permanently and apply its flagged revocations (each audited). Pending "
                  "rows stay pending as evidence; a closed campaign is -32602 'campaign is closed'." + DENY_ENGINE,
      input_schema=obj({"campaign_id": UUID}, ["campaign_id"]),
      output_schema=obj({"closed": boolean(), "revocations_applied": integer(0)}, ["closed"]))
def close_access_review(ctx, args):
    return reviews.close_access_review(ctx.principal, args["campaign_id"], cid=ctx.cid)


# --- the KEK ----------------------------------------------------------------------------------------

@tool(name="rotate_kek", title="Rotate the secrets KEK", securable="Security", operation="Write",
      effect="additive", idempotent=False,
      description="Create a new key-encryption-key version and re-wrap every stored secret under it; needs "
                  "approval. Refused within the minimum rotation interval (retry_after_ms says when), at the live "
                  "version ceiling, or while another KEK operation runs. A half_committed failure means: call "
                  "rewrap_secrets, do not rotate again." + GATED + DENY_ENGINE,
      input_schema=obj({"approval_id": APPROVAL_ID}),
      output_schema=obj({"new_version": integer(1), "rotation_complete": boolean()},
                        ["new_version", "rotation_complete"]))
def rotate_kek(ctx, args):
    return kek.rotate_kek(ctx.principal, cid=ctx.cid)


@tool(name="rewrap_secrets", title="Re-wrap stored secrets", securable="Security", operation="Write",
      effect="additive", idempotent=True,
      description="Finish an interrupted KEK rotation by re-wrapping rows still on older versions; safe to repeat; "
                  "needs approval. rows_rewrapped 0 is a normal outcome (nothing was behind)." + GATED + DENY_ENGINE,
      input_schema=obj({"approval_id": APPROVAL_ID}),
      output_schema=obj({"rows_rewrapped": integer(0)}, ["rows_rewrapped"]))
def rewrap_secrets(ctx, args):
    return kek.rewrap_secrets(ctx.principal, cid=ctx.cid)


@tool(name="get_kek_status", title="KEK status", securable="Security", operation="Read",
      description="Show the active KEK version, the oldest version still in use, whether rotation is complete, "
                  "and lock diagnostics. oldest_in_use and live_versions are null when no secret is stored; "
                  "lock_held null means unknown. unreadable_secrets counts stored values that are not sealed "
                  "secrets at all (damaged rows): no KEK opens them and no rewrap moves them." + DENY_ENGINE,
      input_schema=obj({}),
      output_schema=obj({"active_version": nullable(integer()), "oldest_in_use": nullable(integer()),
                         "rotation_complete": boolean(), "live_versions": nullable(integer()),
                         "lock_held": nullable(boolean()), "lock_holder_pid": nullable(integer()),
                         "lock_holder_captured_at": nullable(string(64)), "unreadable_secrets": integer(0)},
                        ["active_version", "oldest_in_use", "rotation_complete"]))
def get_kek_status(ctx, args):
    return kek.get_kek_status(ctx.principal)
