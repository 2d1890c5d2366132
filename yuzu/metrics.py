"""Prometheus metric families. Every family the product exports is declared here, in one place,
so /metrics and docs/metrics.md agree."""

from collections.abc import Container

from prometheus_client import Counter, Gauge, Histogram

HTTP_REQUESTS = Counter("yuzu_http_requests_total", "HTTP requests served by Django views", ["method", "route", "status"])
HTTP_LATENCY = Histogram("yuzu_http_request_duration_seconds", "Django view latency", ["method", "route"])

MCP_REQUESTS = Counter("yuzu_mcp_requests_total", "MCP JSON-RPC requests", ["method", "outcome"])
#: the notifications a client may send (MCP), counted by name
MCP_NOTIFICATIONS = frozenset({"notifications/initialized", "notifications/cancelled", "notifications/progress",
                               "notifications/roots/list_changed", "notifications/tasks/status"})


def mcp_method_label(method: object, known: Container[str] = ()) -> str:
    """MCP_REQUESTS' method label: ``response`` for a client's JSON-RPC response (no method), a method this server
    answers (``known``) or a notification by its name, anything else ``unknown`` — the method is the client's
    text, and a label value per invented one grew every process's series (and the public /metrics) for good."""
    if method is None:
        return "response"
    return method if isinstance(method, str) and (method in known or method in MCP_NOTIFICATIONS) else "unknown"


MCP_TOOL_CALLS = Counter("yuzu_mcp_tool_calls_total", "MCP tools/call by tool and audit result", ["tool", "result"])
MCP_TOOL_LATENCY = Histogram("yuzu_mcp_tool_call_duration_seconds", "MCP tools/call latency", ["tool"])
MCP_SESSIONS_ACTIVE = Gauge("yuzu_mcp_sessions_active", "Live MCP sessions in this process")
MCP_SESSIONS_OPENED = Counter("yuzu_mcp_sessions_opened_total", "MCP sessions minted")
MCP_INITIALIZE_PROTOCOL = Counter("yuzu_mcp_initialize_protocol_total", "initialize by negotiated revision", ["revision"])
MCP_BODY_TOO_LARGE = Counter("yuzu_mcp_body_too_large_total", "MCP bodies refused by the body bound", ["reason"])
MCP_TOOL_SECURITY_MISCONFIG = Counter("yuzu_mcp_tool_security_misconfig_total", "tools served without a security row")
MCP_TOOL_ARGS_INVALID = Counter("yuzu_mcp_tool_args_invalid_total", "tools/call refused by input-schema validation", ["tool"])
MCP_POLL = Counter("yuzu_mcp_poll_total", "result-poll tool verdicts", ["tool", "result"])
MCP_APPROVAL_REFUSED = Counter("yuzu_mcp_approval_refused_total", "approval recalls refused")
MCP_APPROVAL_MASKED = Counter("yuzu_mcp_approval_masked_denials_total", "consume refusals masked as 'already used'")
MCP_APPROVAL_PRECONDITION = Counter("yuzu_mcp_approval_precondition_denied_total", "recalls refused by a pre-consume precondition")
MCP_APPROVAL_BURNED = Counter("yuzu_mcp_approval_burned_total", "consumed tickets whose call was then refused", ["tool", "reason"])

APPROVAL_NOTIFICATIONS = Counter(
    "yuzu_approval_notifications_total", "approval notifications by channel and outcome (approvals.notify)",
    ["channel", "outcome"])
FLEET_COMMAND_SENDS = Counter("yuzu_fleet_command_sends_total",
                              "Commands written to agent WebSockets by this process", ["attempt"])
FLEET_COMMAND_UNSENT = Counter("yuzu_fleet_command_unsent_total",
                               "Commands that reached a connection already closing (re-sent if not acknowledged)")
FLEET_CATALOGUE_DROPPED = Counter("yuzu_fleet_catalogue_dropped_total",
                                  "Plugin actions left out of an agent's declared catalogue for an unusable schema")
FLEET_RESULT_QUERIES = Counter(
    "yuzu_fleet_result_queries_total",
    "Commands held as running that a (re-)registering agent was asked about (asked), its answers (kept: the terminal "
    "frame it kept; running; unknown: it no longer knew the command), and result.answer frames refused (refused)",
    ["outcome"])
FLEET_COMMAND_ACK_SECONDS = Histogram("yuzu_fleet_command_ack_seconds",
                                      "From a command's last send to the agent's acknowledgement",
                                      buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80))
AGENT_AUTH_FAILURES = Counter("yuzu_agent_auth_failures_total", "Refused agent enrolments and registers", ["action"])
AGENT_ORIGIN_REFUSED = Counter("yuzu_agent_origin_refused_total",
                               "Agent WebSocket handshakes refused for carrying an Origin header (a browser)")

POLICY_VERDICTS = Counter("yuzu_server_policy_verdicts_total", "Policy verdicts written, by status", ["status"])
POLICY_EVAL_ERRORS = Counter("yuzu_server_policy_eval_errors_total",
                             "Policy evaluations that ended in error, by phase (check, fix, verify)", ["phase"])
GUARDIAN_POLICY_GENERATION = Gauge("yuzu_server_guardian_policy_generation",
                                   "Pushes of the Guardian rule set since this process started")
GUARDIAN_EVENTS = Counter("yuzu_server_guardian_events_total", "Guardian events received from agents")
GUARDIAN_EVENTS_WRITTEN = Counter("yuzu_server_guardian_events_written_total", "Guardian events stored")
GUARDIAN_EVENTS_DROPPED = Counter("yuzu_server_guardian_events_dropped_total",
                                  "Guardian events refused (malformed, or naming an unknown rule)")
GUARDIAN_EVENTS_REAPED = Counter("yuzu_server_guardian_events_reaped_total",
                                 "Guardian events deleted by the retention sweep")
CA_CERT_ISSUED = Counter("yuzu_server_ca_cert_issued_total", "Certificates issued by the internal CA", ["purpose"])
CA_CRL_PUBLISH_FAILURES = Counter("yuzu_server_ca_crl_publish_failures_total", "CRL publications that failed")
CA_REISSUE_BLOCKED = Counter("yuzu_server_ca_reissue_blocked_total",
                             "Agent certificate requests refused while the agent's revocation stands")
CA_REVOKED_CERT = Counter("yuzu_server_revoked_cert_total",
                          "Agent connections refused or closed for presenting a revoked certificate", ["channel"])
CA_CERTS_EXPIRING = Gauge("yuzu_server_ca_certs_expiring_14d",
                          "Active certificates of the internal CA that expire within 14 days")

# DEX telemetry (docs/dex.md): the fleet gauges are computed at scrape time by dex.metrics.FleetCollector.
DEX_TELEMETRY_FRAMES = Counter("yuzu_server_dex_telemetry_frames_total", "DEX telemetry frames received from agents",
                               ["kind"])
DEX_TELEMETRY_DROPPED = Counter("yuzu_server_dex_telemetry_dropped_total",
                                "DEX telemetry values dropped by validation (never stored as 0), by field and reason",
                                ["field", "reason"])
DEX_ROWS_REAPED = Counter("yuzu_server_dex_rows_reaped_total",
                          "DEX rows deleted by retention: past their age, or past their agent's row cap", ["table"])
DEX_ALERT_FIRED = Counter("yuzu_server_dex_alert_fired_total", "DEX blast-radius alerts raised")
DEX_BLAST_RADIUS_DEVICES = Histogram("yuzu_server_dex_blast_radius_devices",
                                     "Distinct devices behind each blast-radius alert")

# governance (spec/governance.md): access reviews (REST only), secrets at rest
ACCESS_REVIEW_EXPORT = Counter("yuzu_access_review_export_total", "access-review exports over REST", ["format"])
ACCESS_REVIEW_EXPORT_SECONDS = Histogram("yuzu_access_review_export_duration_seconds", "access-review export time")
ACCESS_REVIEW_CAMPAIGNS_OPENED = Counter("yuzu_access_review_campaigns_opened_total", "access-review campaigns opened over REST")
ACCESS_REVIEW_ATTESTATIONS = Counter("yuzu_access_review_attestations_total", "attestations recorded over REST", ["decision"])
SECRET_DECRYPT_FAILURES = Counter("yuzu_server_secret_decrypt_failures_total", "sealed secrets that did not open",
                                  ["store", "failure_class"])

STORE_FAULTS = Counter("yuzu_store_faults_total", "Requests refused because a backing store failed (yuzu.faults)",
                       ["store", "kind"])
