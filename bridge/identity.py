"""Who is calling the bridge, decided from the connection only (spec §2.1).

Invariants:

* The role comes from the bearer token, never from an argument: a worker's token (audience "bridge",
  minted at spawn, linked from its Member and handed to that worker's pane only) makes the caller that
  worker; anyone else authenticated is a primary. A bridge token that belongs to no worker is refused.
* A primary's world is its own principal key (so two tokens, even of one user, are two primaries); a
  worker sees its own primary's world and nothing else. Every lookup of a worker is confined to the
  caller's world (``Caller.world_key``).
* Each tool is for one role (``require``); the other role gets ``wrong_role`` before any side effect.
* **A world follows its token's rotation.** A rotated token's live successor is the same primary (as approvals
  redeem a ticket for the asking token or its rotation successor): the predecessor's world — workers, turns,
  unacknowledged inbox — becomes the successor's at the successor's first bridge call, or at the poller's sweep once
  the predecessor is no longer live (``follow_rotation``). Until then the predecessor, live for its overlap, keeps
  it; no world stays under a token that is gone while a successor is live.
"""

from dataclasses import dataclass

from django.db import transaction

from yuzu.audit import audit
from yuzu.models import ApiToken
from yuzu.rbac import Principal

from .failures import BridgeFailure
from .models import Member, Role, holds_world, move_world

PRIMARY, WORKER = Role.PRIMARY, Role.WORKER


@dataclass
class Caller:
    principal: object
    role: str
    member: Member | None = None

    @property
    def world_key(self):
        """The primary whose world this caller sees (a worker sees its own primary's)."""
        return self.member.owner_key if self.member is not None else self.principal.key

    @property
    def inbox_key(self):
        return self.principal.key

    @property
    def name(self):
        return self.member.name if self.member is not None else self.principal.name


def identify(principal):
    token = getattr(principal, "token", None)
    if token is not None and token.audience == ApiToken.AUDIENCE_BRIDGE:
        member = Member.objects.select_related("profile").filter(token_id=token.pk).first()
        if member is None:
            raise BridgeFailure("not_a_worker", "this bridge token belongs to no worker")
        return Caller(principal, WORKER, member)
    if token is not None and token.rotated_from_id is not None:
        _adopt_predecessors(principal)
    return Caller(principal, PRIMARY)


#: how many rotations back (and forward) a primary's world is followed, as approvals.gate follows a ticket's asker
MAX_ROTATIONS = 32


def live_successor(token_id, owner_id):
    """The newest live token of ``owner_id`` in the rotation chain after token ``token_id``, or None."""
    found, current = None, token_id
    for _ in range(MAX_ROTATIONS):
        nxt = ApiToken.objects.filter(rotated_from_id=current, owner_id=owner_id).first()
        if nxt is None:
            break
        if nxt.is_live():
            found = nxt
        current = nxt.pk
    return found


def follow_rotation(key, by="system"):
    """If the token of the primary ``key`` was rotated and a successor of it is live, that successor is this
    primary from now on: its world moves there (``models.move_world``), each live worker audited
    ``bridge.handover``. Returns the successor's key, or None (no live successor: nothing moved)."""
    token_id = Principal.token_id_of(key)
    owner_id = ApiToken.objects.filter(pk=token_id).values_list("owner_id", flat=True).first() if token_id else None
    successor = live_successor(token_id, owner_id) if owner_id is not None else None
    if successor is None:
        return None
    new_key = Principal.key_for(owner_id, successor.pk)
    with transaction.atomic():  # the handover and its record commit together
        live, items = move_world(key, new_key)
        for m in live:
            audit(by, "bridge.handover", "success", target_type="BridgeMember", target_id=m.session_id,
                  detail=f"reason=rotation from={token_id} to={successor.pk} pane={m.pane_id} inbox_items={items}",
                  strict=True)
    return new_key


def _adopt_predecessors(principal):
    """The caller's token is a rotation successor: whatever its predecessors' worlds still hold becomes the newest
    live successor's — this caller's, unless it was rotated again itself."""
    owner_id, previous = principal.user.pk, principal.token.rotated_from_id
    for _ in range(MAX_ROTATIONS):
        if previous is None:
            return
        key = Principal.key_for(owner_id, previous)
        if holds_world(key):
            follow_rotation(key, principal)
        previous = ApiToken.objects.filter(pk=previous, owner_id=owner_id).values_list("rotated_from_id",
                                                                                     flat=True).first()


def require(caller, role, tool):
    if caller.role != role:
        who = "the primary" if role == PRIMARY else "a worker"
        raise BridgeFailure("wrong_role", f"{tool} is for {who}; this connection is a {caller.role}")


def whoami(caller):
    if caller.member is not None:
        m = caller.member
        return {"role": WORKER, "sessionId": m.session_id, "paneId": m.pane_id, "terminalId": m.terminal_id,
                "profile": m.profile_name, "name": m.name, "primary": m.owner.get_username()}
    return {"role": PRIMARY, "sessionId": caller.principal.key, "name": caller.principal.name}
