"""Approvals for modern (2026-07-28) clients: a gated call answers ``input_required`` instead of ``-32006``.

A client that declares URL elicitation (``clientCapabilities.elicitation.url``) gets, for a call that needs a
human approval, an ``InputRequiredResult``: a URL elicitation pointing at the ticket's review page, and a
``requestState`` that names the ticket. The client shows the URL, then retries the same call with the state
echoed. The retry goes through the whole pipeline again as a recall with that ``approval_id`` — the same
pinned targets, the same single-use consume, the same anti-replay rules as ticket-then-recall — so it runs at
most once; while the ticket is pending the answer is ``input_required`` again.

``requestState`` is attacker input. It is signed with the server's key (Django's ``signing``: HMAC-SHA256 over
the payload and a timestamp, salted for this use) and binds the ticket to the principal (token), the
catalogue, the tool and a digest of the canonical arguments, for at most STATE_MAX_AGE. A state that fails any
of these is refused (-32003) before anything else happens.

A client without URL elicitation keeps ``-32006`` and the ``approval_id`` recall: never ``-32021``, which would
lock it out.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from urllib.parse import urljoin

from django.core import signing

from yuzu.audit import audit
from yuzu.auth import public_base
from yuzu.jsondata import JsonObject

from . import jsonrpc as rpc
from .context import ToolContext
from .pipeline import a4
from .server import Continuation, Request

STATE_SALT = "yuzu.mcp.requestState.approval"
STATE_MAX_AGE = 24 * 3600  # seconds; every pending round issues a fresh one, the ticket itself lives 7 days
INPUT_KEY = "approval"
INVALID_STATE = "requestState is not valid for this call"

Call = Callable[[ToolContext, Request, JsonObject], "JsonObject | Continuation"]


def wants_url_elicitation(capabilities: JsonObject) -> bool:
    elicitation = capabilities.get("elicitation")
    return isinstance(elicitation, dict) and isinstance(elicitation.get("url"), dict)


def digest(arguments: object) -> str:
    """The canonical arguments (sorted keys, compact, approval_id never part of it), hashed."""
    args = {k: v for k, v in arguments.items() if k != "approval_id"} if isinstance(arguments, dict) else arguments
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def seal(ctx: ToolContext, name: str, arguments: object, approval_id: str) -> str:
    return signing.dumps({"a": approval_id, "p": ctx.principal.key, "c": ctx.catalogue, "t": name,
                          "d": digest(arguments)}, salt=STATE_SALT, compress=False)


def unseal(ctx: ToolContext, name: object, arguments: object, state: object) -> str:
    """The approval_id the state names, or the -32003 refusal (audited) when it is forged, expired, another
    principal's, or for another call."""
    reason = None
    try:
        payload = signing.loads(state if isinstance(state, str) else "", salt=STATE_SALT, max_age=STATE_MAX_AGE)
    except signing.SignatureExpired:
        reason, payload = "expired", None
    except signing.BadSignature:
        reason, payload = "bad_signature", None
    if payload is not None:
        if not isinstance(payload, dict) or not isinstance(payload.get("a"), str):
            reason = "malformed"
        elif payload.get("p") != ctx.principal.key:
            reason = "foreign_principal"
        elif payload.get("c") != ctx.catalogue or payload.get("t") != name:
            reason = "other_tool"
        elif payload.get("d") != digest(arguments):
            reason = "other_arguments"
        elif isinstance(arguments, dict) and arguments.get("approval_id") not in (None, payload["a"]):
            reason = "other_approval"
    if reason is None:
        assert isinstance(payload, dict)
        approval_id: str = payload["a"]
        return approval_id
    tool = name if isinstance(name, str) and len(name) <= 128 else "unknown"
    audit(ctx.principal, f"mcp.{tool}", "denied", target_type="mcp_tool", target_id=tool,
          detail=f"request_state_invalid:{reason}", correlation_id=ctx.cid)
    raise rpc.RpcError(rpc.PERMISSION_DENIED, INVALID_STATE, a4(
        ctx.cid, remediation="retry the call without requestState (a pending identical request is found again)"))


def call_tool(ctx: ToolContext, req: Request, params: JsonObject, capabilities: JsonObject,
              call: Call) -> JsonObject | Continuation:
    """tools/call for a modern request: the recall a requestState names, and -32006 as input_required for a
    client that can open a URL."""
    name, arguments = params.get("name"), params.get("arguments")
    state = params.get("requestState")
    if state is not None:
        approval_id = unseal(ctx, name, arguments, state)
        responses = params.get("inputResponses")
        answer = responses.get(INPUT_KEY) if isinstance(responses, dict) else None
        if isinstance(answer, dict) and answer.get("action") in ("decline", "cancel"):
            raise rpc.RpcError(rpc.PERMISSION_DENIED, f"the approval request was {answer['action']}d in the client",
                               a4(ctx.cid, remediation="the ticket stays pending; call again when you want it",
                                  approval_id=approval_id))
        params = {**params, "arguments": {**(arguments if isinstance(arguments, dict) else {}),
                                          "approval_id": approval_id}}
    try:
        return call(ctx, req, params)
    except rpc.RpcError as err:
        data = err.data if isinstance(err.data, dict) else {}
        if err.code != rpc.APPROVAL_REQUIRED or not wants_url_elicitation(capabilities) \
                or not isinstance(data.get("approval_id"), str) or not isinstance(name, str):
            raise
        approval_id = data["approval_id"]
        url = urljoin(public_base(req.headers.get("host")) + "/", str(data.get("review_url") or ""))
        return {
            "resultType": "input_required",
            "inputRequests": {INPUT_KEY: {"method": "elicitation/create", "params": {
                "mode": "url", "url": url,
                "message": f"{err.message}. Ask an approver to review ticket {approval_id} at this address "
                           "(you cannot approve your own request), then continue: the call runs once it is "
                           "approved."}}},
            "requestState": seal(ctx, name, arguments, approval_id),
        }
