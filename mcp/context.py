from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from yuzu.jsondata import JsonObject

if TYPE_CHECKING:
    from yuzu.plans import Plan
    from yuzu.rbac import Principal

    from .jsonrpc import RequestId

#: (progress, total, terminal): how far the followed work is
Snapshot = tuple[int, int, bool]


@dataclass
class FollowSpec:
    """What a tool handler asks to follow (set through ToolContext.follow); mcp.streaming.follower reports it."""

    group: str  # channel-layer group whose messages announce a change
    snapshot: Callable[[], Snapshot]  # sync
    final: Callable[[], JsonObject]  # sync: the structured result for the final frame
    meta: JsonObject
    message: str = ""
    # (recipe name, JSON arguments): how another server process rebuilds this spec to take the follow over when
    # this one dies (mcp.streaming.handover); None: the follow cannot outlive its process
    resume: tuple[str, JsonObject] | None = None


#: name -> builder of a FollowSpec from JSON arguments (registered by the tools whose follows may be adopted)
FOLLOW_RECIPES: dict[str, Callable[[JsonObject], FollowSpec]] = {}


def follow_recipe(name: str) -> Callable[[Callable[[JsonObject], FollowSpec]], Callable[[JsonObject], FollowSpec]]:
    """Register a FollowSpec builder under ``name``; the spec it builds carries ``resume=(name, args)``, so a
    streamed call's follow can be rebuilt from its record in another process (mcp.streaming.handover)."""

    def register(build: Callable[[JsonObject], FollowSpec]) -> Callable[[JsonObject], FollowSpec]:
        def built(args: JsonObject) -> FollowSpec:
            spec = build(args)
            spec.resume = (name, args)
            return spec

        FOLLOW_RECIPES[name] = built
        return built

    return register


class CallExtras(TypedDict, total=False):
    """What the transport tells a call besides its arguments."""

    protocol_version: str  # the session's negotiated MCP revision, or the modern request's own
    client: dict[str, str | None]  # the session's clientInfo: {"name", "version"} (shown to approvers; never trusted)
    progress_mode: str | None  # "post" (SSE on this response) | "get" (progress on the GET channel) | None
    admitted: str  # the ring key of a streamed POST admitted before the tool ran (mcp.streaming.admission)
    task_reservation: str  # the slot under the token's task cap a call that may become a task holds (mcp.tasks)


@dataclass
class ToolContext:
    """What a tool handler knows about its call. Identity comes from the connection only."""

    principal: Principal
    cid: str  # the correlation id minted for this call
    tool: str = ""
    catalogue: str = "v1"
    session_id: str | None = None
    request_id: RequestId = None
    progress_token: str | int | None = None
    approval: object = None  # the consumed approval ticket on a gated recall (the approvals app's)
    plan: Plan[Any] | None = None  # the call's Plan, worked out before any side effect
    detail: list[str] = field(default_factory=list)  # audit detail fragments a handler adds ("execution_id=…")
    audited: bool = False  # the call's outcome row is written already (a recall's, in its own transaction)
    extra: CallExtras = field(default_factory=CallExtras)

    following: FollowSpec | None = None  # set by follow()

    def note(self, text: str) -> None:
        self.detail.append(text)

    def follow(self, group: str, *, snapshot: Callable[[], Snapshot], final: Callable[[], JsonObject],
               meta: JsonObject | None = None, message: str = "") -> None:
        """Report progress of the work this call started: ``group`` is the channel-layer group announcing
        changes; ``snapshot()`` → (progress, total, terminal); ``final()`` → the structured result sent
        last on a streamed POST. A no-op unless the caller sent a progressToken on a session, or on a modern
        (2026-07-28) request admitted to stream its response."""
        self.follow_spec(FollowSpec(group=group, snapshot=snapshot, final=final, meta=meta or {}, message=message))

    def follow_spec(self, spec: FollowSpec) -> None:
        """``follow`` with a ready spec (one a ``follow_recipe`` built, which another process can rebuild)."""
        if self.progress_token is None or (self.session_id is None and "admitted" not in self.extra):
            return
        self.following = spec
