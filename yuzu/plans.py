"""What a call will do, worked out before anything happens (the "validate before side effects" rule).

A capability's service exposes ``plan_<capability>(principal, …, pinned=None) -> Plan``: its ONE
validation function. It runs every check that can run before a side effect (meaning of the input,
lookups, permission on the objects, target resolution) and raises ``YuzuError`` / ``ValidationError`` on a
refusal; the capability then acts on ``plan.value``. The MCP tool declares it as its ``prepare`` hook, so
the approval gate can show a human exactly what will happen — ``summary``, ``risk``, ``facts`` — and pin
``pins`` (what was resolved live, e.g. ``{"agents": [ids]}``). Re-planned with ``pinned=`` those pins, the
call acts on what was approved and nothing else."""

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .errors import YuzuError
from .jsondata import JsonObject

#: parameter names whose values are secrets: stored redacted, shown redacted, sent only to the agent
SENSITIVE_KEY_RE = re.compile(r"password|passwd|secret|token|key|credential", re.IGNORECASE)


V = TypeVar("V")


@dataclass
class Plan(Generic[V]):
    """``value`` is what the capability acts on (its own type: ``Plan[TokenFields]``, ``Plan[User]`` …); ``pins``
    and ``facts`` are JSON, stored on an approval ticket and shown to its reviewer."""

    summary: str
    value: V
    pins: JsonObject = field(default_factory=dict)
    risk: str = ""
    facts: JsonObject = field(default_factory=dict)


def redact(params: JsonObject | None, hide: Callable[[Any], Any] = lambda value: "[redacted]") -> JsonObject:
    """Command parameters with each value whose name marks a secret replaced: by [redacted] for display, or by
    ``hide(value)`` (an approval ticket keeps a keyed hash, approvals.gate)."""
    return {k: hide(v) if SENSITIVE_KEY_RE.search(k) else v for k, v in (params or {}).items()}


def redact_arguments(args: JsonObject, hide: Callable[[Any], Any] = lambda value: "[redacted]") -> JsonObject:
    """A tool call's arguments with the secret command parameters redacted wherever a call carries them:
    ``params`` (execute_instruction) and each step's ``params`` (execute_bundle)."""
    out = dict(args)
    if isinstance(out.get("params"), dict):
        out["params"] = redact(out["params"], hide)
    if isinstance(out.get("steps"), list):
        out["steps"] = [{**step, "params": redact(step["params"], hide)}
                        if isinstance(step, dict) and isinstance(step.get("params"), dict) else step
                        for step in out["steps"]]
    return out


def role_pins(role_pk: int, permissions: list[str]) -> JsonObject:
    """What a role grant's ticket pins of the role: which one, and the permissions its approver was shown."""
    return {"role": role_pk, "role_permissions": sorted(permissions)}


def check_role_pin(pinned: JsonObject | None, name: str, role_pk: int, permissions: list[str]) -> None:
    """On an approved recall: the role found by ``name`` now must be the one the ticket pinned, holding the permissions
    its approver saw — a role renamed and replaced by a namesake, or edited since, is not what was approved (the
    ticket is kept: a role put back as it was is granted)."""
    if not pinned or "role" not in pinned:
        return
    if pinned["role"] != role_pk or pinned.get("role_permissions") != sorted(permissions):
        raise YuzuError(f"role {name} changed after the approval (renamed and replaced, or its permissions edited): "
                        "the approval does not cover it", status=409, rpc_code=-32602,
                        remediation="call again without approval_id to ask for an approval of the role as it is now")
