from dataclasses import dataclass, field


@dataclass
class FollowSpec:
    """What a tool handler asks to follow (set through ToolContext.follow); mcp.streaming.follower reports it."""

    group: str  # channel-layer group whose messages announce a change
    snapshot: object  # sync () -> (progress, total, terminal)
    final: object  # sync () -> structured result for the final frame
    meta: dict
    message: str = ""


@dataclass
class ToolContext:
    """What a tool handler knows about its call. Identity comes from the connection only."""

    principal: object  # yuzu.rbac.Principal
    cid: str  # the correlation id minted for this call
    tool: str = ""
    catalogue: str = "v1"
    session_id: str | None = None
    request_id: object = None
    progress_token: object = None
    approval: object = None  # the consumed approval ticket on a gated recall
    plan: object = None  # the call's mcp.registry.Plan, worked out before any side effect
    detail: list = field(default_factory=list)  # audit detail fragments a handler adds ("execution_id=…")
    extra: dict = field(default_factory=dict)  # transport-provided extras (e.g. a progress sink)

    following: FollowSpec | None = None  # set by follow()

    def note(self, text):
        self.detail.append(text)

    def follow(self, group, *, snapshot, final, meta=None, message=""):
        """Report progress of the work this call started: ``group`` is the channel-layer group announcing
        changes; ``snapshot()`` → (progress, total, terminal); ``final()`` → the structured result sent
        last on a streamed POST. A no-op unless the caller sent a progressToken on a session."""
        if self.progress_token is None or self.session_id is None:
            return
        self.following = FollowSpec(group=group, snapshot=snapshot, final=final, meta=meta or {}, message=message)
