from dataclasses import dataclass, field


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
    detail: list = field(default_factory=list)  # audit detail fragments a handler adds ("execution_id=…")
    extra: dict = field(default_factory=dict)  # transport-provided extras (e.g. a progress sink)

    def note(self, text):
        self.detail.append(text)
