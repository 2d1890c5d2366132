"""MCP tier policy (spec/yuzu-mcp.md §1.2), shared by the MCP pipeline and the REST auth layer."""

OPERATOR_ALLOWED = {
    ("Tag", "Write"), ("Tag", "Delete"), ("Execution", "Execute"), ("ApiToken", "Rotate"),
    # Project decision: an operator token mints approval tickets (Tag:Delete), so it may withdraw its own
    # (withdraw_approval). approve_request / reject_request share the pair and stay refused over MCP.
    ("Approval", "Write"),
}
SUPERVISED_GATED = {
    ("Execution", "Execute"), ("Policy", "Write"), ("Policy", "Execute"), ("Security", "Write"), ("Security", "Execute"),
    ("UserManagement", "Write"), ("ManagementGroup", "Write"), ("ApiToken", "Write"),
}
TIER_ORDER = ("readonly", "operator", "supervised")


def tier_allows(tier: str, securable: str, operation: str) -> bool:
    """Empty tier (a non-MCP token or a session) → no ceiling."""
    if not tier:
        return True
    if tier == "readonly":
        return operation == "Read"
    if tier == "operator":
        return operation == "Read" or (securable, operation) in OPERATOR_ALLOWED
    if tier == "supervised":
        return True
    return False


def requires_approval(tier: str, securable: str, operation: str) -> bool:
    if tier == "supervised":
        return operation == "Delete" or (securable, operation) in SUPERVISED_GATED
    if tier == "operator":
        return (securable, operation) == ("Tag", "Delete")
    return False


def tier_floor(securable: str, operation: str) -> str:
    """The lowest tier whose tier_allows passes (supervised allows everything)."""
    return next(tier for tier in TIER_ORDER if tier_allows(tier, securable, operation))
