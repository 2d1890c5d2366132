"""Orientation reads for LLM clients: posture, question classification, playbooks, summaries and the
REST route catalogue. Everything is computed from live data; nothing is canned fleet state."""

import re
import threading
import time

from django.db.models import Count

from mcp.schema import array, boolean, enum, integer, obj, string
from yuzu import rbac

from .services import visible_agents

POSTURE_SCHEMA = obj({
    "generated_at": integer(0), "data_age_seconds": {"type": "number"}, "partial": boolean(),
    "missing_sources": array(string(64)),
    "agents": obj({"total": integer(0), "connected": integer(0), "disconnected": integer(0),
                   "quarantined": integer(0)}, additional=True),
    "os_mix": {"type": "object", "additionalProperties": {"type": "integer"}},
    "recommended_next_tools": array(string(64)),
}, ["generated_at", "data_age_seconds", "partial", "agents", "os_mix", "recommended_next_tools"])

CATEGORIES = ("answerable_now", "answerable_with_live_dispatch", "requires_external_connector",
              "unsafe_without_approval", "outside_yuzu_scope")
CLASSIFY_SCHEMA = obj({"category": enum(CATEGORIES), "confidence": {"type": "number"},
                       "matched_keywords": array(string(64)), "suggested_tools": array(string(64)),
                       "advisory": boolean()}, ["category", "suggested_tools"])
PLAYBOOK_SCHEMA = obj({"found": boolean(), "scenario": string(2048), "first_tool": string(64),
                       "steps": array(string(1024)), "safety": array(string(1024)),
                       "known_scenarios": array(string(128))}, ["found"])
SUMMARY_SCHEMA = obj({"kind": string(32), "narrative": string(8192),
                      "items": array({"type": "object"}), "resource_links": array(string(256))},
                     ["kind", "narrative", "items"])

_cache = {}
_cache_lock = threading.Lock()


def fleet_posture(principal, ttl_seconds=30):
    key = principal.key
    now = time.time()
    with _cache_lock:
        hit = _cache.get(key)
    if hit is None or now - hit["generated_at"] > ttl_seconds:
        qs = visible_agents(principal)
        total = qs.count()
        connected = qs.filter(connected=True).count()
        hit = {
            "generated_at": int(now),
            "partial": False,
            "missing_sources": [],
            "agents": {"total": total, "connected": connected, "disconnected": total - connected,
                       "quarantined": qs.filter(quarantined=True).count()},
            "os_mix": {row["os"] or "unknown": row["n"] for row in qs.values("os").annotate(n=Count("pk"))},
        }
        tools = ["list_agents"]
        if total - connected:
            tools.append("get_agent_details")
        tools += ["execute_instruction", "get_execution_status"] if connected else ["query_audit_log"]
        hit["recommended_next_tools"] = tools
        with _cache_lock:
            _cache[key] = hit
    return {**hit, "data_age_seconds": round(now - hit["generated_at"], 3)}


RULES = [
    ("unsafe_without_approval", r"\b(reboot|restart|delete|remove|kill|quarantine|wipe|uninstall|shutdown|revoke)\b",
     ["execute_instruction", "quarantine_device"]),
    ("requires_external_connector", r"\b(openshift|kubernetes|k8s|libvirt|kvm|oracle|teams|zoom|jira|servicenow|"
                                    r"crowdstrike|zscaler|splunk)\b", ["classify_operational_question"]),
    ("answerable_with_live_dispatch", r"\b(running|process|processes|uptime|disk|memory|cpu|service|hash|"
                                      r"interfaces?|right now|currently|pending reboot)\b",
     ["execute_instruction", "get_execution_status", "query_responses"]),
    ("answerable_now", r"\b(agents?|devices?|endpoints?|tags?|groups?|audit|who|inventory|connected|offline|"
                       r"approvals?|tokens?|fleet)\b", ["list_agents", "get_fleet_posture_fast", "query_audit_log"]),
]


def classify(question):
    q = question.lower()
    for category, pattern, tools in RULES:
        matched = sorted(set(re.findall(pattern, q)))
        if matched:
            return {"category": category, "confidence": min(1.0, 0.5 + 0.15 * len(matched)),
                    "matched_keywords": matched, "suggested_tools": tools, "advisory": True}
    return {"category": "outside_yuzu_scope", "confidence": 0.3, "matched_keywords": [],
            "suggested_tools": ["get_fleet_posture_fast"], "advisory": True}


PLAYBOOKS = {
    "agent offline": {
        "first_tool": "get_agent_details",
        "steps": ["get_agent_details for the agent: check connected and last_seen",
                  "query_audit_log action=agent. for recent enrolment or quarantine events",
                  "if other agents in its groups are also offline, suspect the network, not the agent"],
        "safety": ["Do not re-enrol or quarantine without a human approval."],
    },
    "pending reboot": {
        "first_tool": "execute_instruction",
        "steps": ["execute_instruction plugin=reboot action=pending on the affected scope",
                  "get_execution_status until terminal, then query_responses",
                  "prepare_remediation_plan for agents reporting pending:true"],
        "safety": ["Rebooting is out of band: ask a human; yuzu only reports."],
    },
    "disk full": {
        "first_tool": "execute_instruction",
        "steps": ["execute_instruction plugin=disk action=usage on the agent",
                  "query_responses to read mount points above 90%",
                  "process.list to find large writers if needed"],
        "safety": ["Never delete files through script.run without an approval."],
    },
    "suspected compromise": {
        "first_tool": "get_agent_details",
        "steps": ["get_agent_details and query_audit_log for the agent",
                  "execute_instruction process.list and network.interfaces",
                  "quarantine_device (supervised token, human approval) if confirmed"],
        "safety": ["Quarantine needs a supervised token and a human approval."],
    },
}


def playbook(scenario):
    key = scenario.strip().lower()
    book = PLAYBOOKS.get(key)
    if book is None:
        return {"found": False, "scenario": scenario[:2048], "known_scenarios": sorted(PLAYBOOKS)}
    return {"found": True, "scenario": key, **book, "known_scenarios": sorted(PLAYBOOKS)}


def summarize(principal, kind, ident=None, limit=25):
    from yuzu.errors import NotFound, PermissionDenied

    from .services import agent_details, agent_view

    if kind == "fleet":
        qs = visible_agents(principal).order_by("-connected", "agent_id")
        total, connected = qs.count(), qs.filter(connected=True).count()
        items = [agent_view(a) for a in qs[:limit]]
        return {"kind": kind, "narrative": f"{total} agents visible, {connected} connected, "
                                           f"{total - connected} disconnected. Showing {len(items)}.",
                "items": items, "resource_links": ["yuzu://server/health"]}
    if kind == "agent":
        if not ident:
            raise NotFound("summarize_working_set kind=agent needs id")
        d = agent_details(principal, ident)
        state = "connected" if d["connected"] else f"disconnected since {d['last_seen']}"
        return {"kind": kind, "narrative": f"Agent {d['agent_id']} ({d['hostname']}, {d['os']}/{d['arch']}) is "
                                           f"{state}; {len(d['tags'])} tags; groups: {', '.join(d['groups']) or 'none'}.",
                "items": [d], "resource_links": []}
    if not rbac.has_any(principal, "Execution", "Read"):
        raise PermissionDenied("Execution:Read")
    from .executions import query_responses, visible_executions

    # Confined like get_execution_status and query_responses: another group's execution reads as absent.
    ex = visible_executions(principal).filter(pk=ident or "").first()
    if ex is None:
        raise NotFound(f"Execution not found: {ident}")
    rows = [{k: r[k] for k in ("agent_id", "status", "exit_code")}
            for r in query_responses(principal, execution_id=ex.id, limit=limit)["responses"]]
    return {"kind": kind, "narrative": f"Execution {ex.id} ({ex.plugin}.{ex.action}) is {ex.status}: "
                                       f"{ex.agents_responded}/{ex.agents_targeted} responded, "
                                       f"{ex.agents_failure} failed.", "items": rows, "resource_links": []}


_routes = None


def routes():
    global _routes
    if _routes is None:
        from drf_spectacular.generators import SchemaGenerator

        doc = SchemaGenerator().get_schema(request=None, public=True)
        rows = []
        for path, ops in doc.get("paths", {}).items():
            for method, op in ops.items():
                rows.append({"method": method.upper(), "path": path, "summary": op.get("summary", "")})
        _routes = rows
    return {"routes": _routes, "count": len(_routes)}
