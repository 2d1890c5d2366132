"""Who is calling the bridge, decided from the connection only (spec §2.1).

Invariants:

* The role comes from the bearer token, never from an argument: a worker's token (audience "bridge",
  minted at spawn, linked from its Member and handed to that worker's pane only) makes the caller that
  worker; anyone else authenticated is a primary. A bridge token that belongs to no worker is refused.
* A primary's world is its own principal key (so two tokens, even of one user, are two primaries); a
  worker sees its own primary's world and nothing else. Every lookup of a worker is confined to the
  caller's world (``Caller.world_key``).
* Each tool is for one role (``require``); the other role gets ``wrong_role`` before any side effect.
"""

from dataclasses import dataclass

from yuzu.models import ApiToken

from .failures import BridgeFailure
from .models import Member, Role

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
    return Caller(principal, PRIMARY)


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
