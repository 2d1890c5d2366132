"""Orientation reads for LLM clients: posture, question classification, playbooks, summaries and the
REST route catalogue. Everything is computed from live data; nothing is canned fleet state."""

import json
import re
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from django.db.models import Count
from drf_spectacular.generators import SchemaGenerator

from mcp.schema import array, boolean, enum, integer, obj, string
from yuzu import rbac
from yuzu.errors import NotFound

from .executions import query_responses, visible_executions
from .services import agent_details, agent_view, visible_agents

POSTURE_SCHEMA = obj({
    "generated_at": integer(0), "data_age_seconds": {"type": "number"}, "partial": boolean(),
    "missing_sources": array(string(64)),
    "agents": obj({"total": integer(0), "connected": integer(0), "disconnected": integer(0),
                   "quarantined": integer(0)}, additional=True),
    "os_mix": {"type": "object", "additionalProperties": {"type": "integer"}},
    "dex": {"type": "object", "description": "DEX health (docs/dex.md), when the dex app is installed and the "
                                             "caller holds GuaranteedState:Read fleet-wide"},
    "recommended_next_tools": array(string(64), min_items=1),
}, ["generated_at", "data_age_seconds", "partial", "agents", "os_mix", "recommended_next_tools"])

CATEGORIES = ("answerable_now", "answerable_with_live_dispatch", "requires_external_connector",
              "unsafe_without_approval", "delegate_via_bridge", "outside_yuzu_scope")
CLASSIFY_SCHEMA = obj({"category": enum(CATEGORIES), "confidence": {"type": "number"},
                       "matched_keywords": array(string(64)), "suggested_tools": array(string(64), min_items=1),
                       "intent": string(64), "playbook": string(128), "advisory": boolean()},
                      ["category", "suggested_tools"])
PLAYBOOK_SCHEMA = obj({"found": boolean(), "scenario": string(2048), "first_tool": string(64),
                       "steps": array(string(1024)), "safety": array(string(1024)),
                       "known_scenarios": array(string(128))}, ["found"])
SUMMARY_SCHEMA = obj({"kind": string(32), "narrative": string(8192),
                      "items": array({"type": "object"}), "resource_links": array(string(256))},
                     ["kind", "narrative", "items"])

_cache: dict[str, dict] = {}  # principal key -> its last fleet_posture
#: other apps' health sections of the posture (fleet knows none of them): name -> section(principal) returning
#: (a JSON object, the tools it recommends next), or (None, []) when the caller may not read it; registered in their
#: AppConfig.ready (dex: the DEX health)
POSTURE_SECTIONS: dict = {}
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
        for name, section in POSTURE_SECTIONS.items():
            try:
                out, more = section(principal)
                if out is None:  # not the caller's to read (the section's own permission): no key at all
                    continue
                hit[name] = out
                tools += [t for t in more if t not in tools]
            except Exception:  # the section's store is away: say so, keep the rest
                hit["partial"] = True
                hit["missing_sources"].append(name)
        hit["recommended_next_tools"] = tools
        with _cache_lock:
            _cache[key] = hit
    return {**hit, "data_age_seconds": round(now - hit["generated_at"], 3)}


# --- classification: ordered intent rules --------------------------------------------------------
#
# Each intent names the tool to call first and what usually follows. The first intent (in this order)
# whose pattern matches wins, so specific intents (an execution id, "who deleted", "isolate", a worker)
# come before generic ones ("which agents", "fleet"). The vocabulary is an operator's, not the golden
# pack's sentences: bench/prompt_pack/ scores it, with a held-out quarter it was not tuned on.

HOST = r"\b[a-z][a-z0-9]*-\d+[a-z0-9.-]*\b"  # web-03, laptop-17, db-01.example.test
HEX_ID = r"\b[0-9a-f]{32}\b"
FLEET_WIDE = r"\b(which|how many|list|all|any|several|half|every|fleet|agents|machines|hosts|endpoints|servers)\b"


@dataclass(frozen=True)
class Intent:
    name: str
    category: str
    tools: tuple  # the first tool, then what usually follows
    pattern: str
    unless: str = ""  # a match of this vetoes the intent
    host: bool | None = None  # True: only when the question names a host; False: only when it names none
    playbook: str = ""  # an incident playbook to read (get_incident_playbook) for the steps

    def matches(self, q, names_host):
        if self.host is not None and self.host != names_host:
            return []
        if self.unless and re.search(self.unless, q):
            return []
        return [m.group(0) for m in re.finditer(self.pattern, q)]


NOW, LIVE, UNSAFE, CONNECTOR, BRIDGE = ("answerable_now", "answerable_with_live_dispatch", "unsafe_without_approval",
                                        "requires_external_connector", "delegate_via_bridge")
WORKER = r"\b(workers?|delegat\w*|bridge|primary)\b"

INTENTS = [
    # -- the bridge: a worker session, not an endpoint (served at /mcp/bridge/)
    Intent("bridge_whoami", BRIDGE, ("bridge_whoami",),
           r"\b(am i|who am i|whoami)\b.*\b(primary|worker|bridge)\b"),
    Intent("bridge_spawn", BRIDGE, ("bridge_spawn", "bridge_status"),
           r"\b(start|spawn|launch|create|open|bring up)\b.{0,20}\b(new |another |a )?worker\b"),
    Intent("bridge_profiles", BRIDGE, ("bridge_profiles", "bridge_spawn"), r"\bprofiles?\b.*\b(worker|spawn)|"
           r"\b(worker|spawn)\w*\b.*\bprofiles?\b"),
    Intent("bridge_cancel", BRIDGE, ("bridge_cancel", "bridge_status"),
           r"\b(interrupt|cancel|abort|escape)\b.*\b(worker|task|turn)\b", unless=r"\b(request|approval|ticket)\b"),
    Intent("bridge_stop", BRIDGE, ("bridge_stop", "bridge_list"),
           r"\b(stop|shut (it |them )?down|shutdown|kill|terminate|close)\b", unless=r"^(?!.*\bworkers?\b)"),
    Intent("bridge_send", BRIDGE, ("bridge_send", "bridge_poll"),
           r"\b(delegate|hand (it |this )?off|hand over|(ask|have|get|tell) (a|the|my|one of my) workers?)\b"),
    Intent("bridge_poll", BRIDGE, ("bridge_poll", "bridge_ack"),
           r"\b(repl(y|ied|ies)|answer(ed|s)?|messages?|inbox|collect|came back|while i was away)\b",
           unless=r"^(?!.*\bworkers?\b)"),
    Intent("bridge_read", BRIDGE, ("bridge_read", "bridge_status"),
           r"\b(screen|terminal|pane|showing|printing|printed|output)\b", unless=r"^(?!.*\bworkers?\b)"),
    Intent("bridge_status", BRIDGE, ("bridge_status", "bridge_poll"),
           r"\b(busy|idle|status|still (working|running)|stuck|progress|doing|finished|done)\b",
           unless=r"^(?!.*\bworkers?\b)"),
    Intent("bridge_list", BRIDGE, ("bridge_list", "bridge_status"), WORKER),

    # -- tools outside the fleet: yuzu sees endpoints, not these platforms (unless the endpoints are asked about)
    Intent("external_connector", CONNECTOR, ("discover_plugins", "get_fleet_posture_fast"),
           r"\b(openshift|kubernetes|k8s|libvirt|kvm|vmware|esxi|vcenter|oracle|jira|servicenow|zscaler|splunk|"
           r"salesforce|okta|azure ad|entra|teams|zoom|slack|webex|confluence|github|gitlab)\b",
           unless=r"\b(agents?|endpoints?|hosts?|laptops?|desktops?|servers?|machines?|workstations?|devices?|"
                  r"sensor|service|process(es)?|client|installed|uninstall\w*|running on|call quality|choppy|packet loss|"
                  r"latency|jitter)\b|" + HOST),

    # -- approvals: humans review; a client lists, reads, withdraws its own
    Intent("withdraw_approval", NOW, ("withdraw_approval", "list_pending_approvals"),
           r"\b(withdraw|retract|take back|cancel|drop)\b.{0,40}\b(request|approval|ticket)s?\b"),
    Intent("get_approval", NOW, ("get_approval", "list_pending_approvals"),
           r"\b(approval|ticket|request)s?\b.*" + HEX_ID + "|" + HEX_ID + r".*\b(approval|ticket|request)s?\b"),
    Intent("list_pending_approvals", NOW, ("list_pending_approvals", "get_approval"),
           r"\b(approv\w*|reject\w*|tickets?|pending requests?|requests? (waiting|pending)|review queue)\b",
           unless=r"\b(who|audit|history)\b"),

    # -- permissions and audit: reads about the caller and about history
    Intent("check_permission", NOW, ("check_permission", "discover_permissions"),
           r"\b(am i allowed|may i|is my token allowed|do i have (the )?(permission|right|access)|permitted|"
           r"allowed to|permission to|can (i|we|this token) (delete|quarantine|isolate|set|create|revoke|rotate|"
           r"unlock|execute|approve|reject|add|assign|change|write|tag))\b"),
    Intent("discover_permissions", NOW, ("discover_permissions", "check_permission"),
           r"\b(my|our) (permissions?|roles?|rights|grants?)\b|\bwhat (permissions|roles|rights)\b|"
           r"\bwhat can i do\b"),
    Intent("list_management_group_roles", NOW, ("list_management_group_roles", "get_management_group"),
           r"\b(roles?|role assignments?)\b.*\bgroups?\b|\bgroups?\b.*\broles?\b"),
    Intent("query_audit_log", NOW, ("query_audit_log", "summarize_working_set"),
           r"\b(audit (log|trail|rows?|entries|events|history)|in the audit|trail|history|who (did|deleted|changed|created|removed|ran|approved|rejected|modified|set|"
           r"added|revoked|rotated|quarantined|unlocked)|what did\b|denied|failed (actions|calls)|"
           r"activity of)\b"),

    # -- tokens and accounts
    Intent("rotate_api_token", NOW, ("rotate_api_token", "confirm_api_token_rotation"), r"\brotat\w*\b.*\btokens?\b|"
           r"\btokens?\b.*\brotat\w*"),
    Intent("revoke_api_token", UNSAFE, ("revoke_api_token", "list_api_tokens"),
           r"\b(revoke|invalidate|disable|kill)\b.*\btokens?\b|\btokens?\b.*\b(leaked|compromised|revoke)"),
    Intent("create_api_token", UNSAFE, ("create_api_token", "list_api_tokens"),
           r"\b(create|mint|issue|generate|new)\b.{0,30}\btokens?\b"),
    Intent("list_api_tokens", NOW, ("list_api_tokens",), r"\b(api )?tokens?\b"),
    Intent("unlock_account", UNSAFE, ("unlock_account", "query_audit_log"),
           r"\b(unlock|locked out|lockout)\b"),

    # -- changes to endpoints and groups (a human approval on most tiers)
    Intent("quarantine_device", UNSAFE, ("quarantine_device", "get_agent_details"),
           r"\b(isolate|quarantine|contain|cut (it |\w+ )?off|disconnect \w+ from the network|take \w+ off the "
           r"network)\b", unless=r"\b(quarantined|are any|which|how many|is \w+ quarantined)\b"),
    Intent("delete_tag", UNSAFE, ("delete_tag", "get_tags"),
           r"\b(delete|remove|drop|clear|unset)\b.{0,40}\btags?\b"),
    Intent("set_tag", UNSAFE, ("set_tag", "get_tags"),
           r"\b(set|add|apply|put|label|mark)\b.{0,40}\btag\b|\btag\b \S+ (as|with)\b|^tag\b"),
    Intent("add_management_group_member", UNSAFE, ("add_management_group_member", "get_management_group"),
           r"\b(add|put|move|include)\b.{0,60}\b(to|into|in) the \S+( \S+)? group\b|\badd \S+ to \S+ group"),
    Intent("create_management_group", UNSAFE, ("create_management_group", "list_management_groups"),
           r"\b(create|make|set up|new)\b.{0,30}\b(management )?group\b"),
    Intent("assign_management_group_role", UNSAFE, ("assign_management_group_role", "list_management_group_roles"),
           r"\b(grant|assign|give)\b.{0,60}\brole\b"),

    Intent("destructive_on_host", UNSAFE, ("get_agent_details", "execute_instruction"),
           r"\b(reboot|restart|shut ?down|power off|uninstall|wipe|reimage|re-image|kill|terminate|delete files?|"
           r"remove (the )?files?)\b", host=True, unless=r"\b(need(s)?( a)?|pending|required|awaiting)\b"),
    Intent("destructive", UNSAFE, ("preview_scope_targets", "execute_instruction"),
           r"\b(reboot|restart|shut ?down|power off|uninstall|wipe|reimage|re-image|kill|terminate|delete files?|"
           r"remove (the )?files?)\b", unless=r"\b(need(s)?( a)?|pending|required|awaiting)\b"),

    # -- executions already started
    Intent("query_responses", NOW, ("query_responses", "get_execution_status"),
           r"\b(output|results?|responses?|what did it (return|say))\b.*" + HEX_ID + "|" + HEX_ID +
           r".*\b(output|results?|responses?)\b"),
    Intent("get_execution_status", NOW, ("get_execution_status", "query_responses"),
           r"\b(execution|command|instruction|job)\b.*" + HEX_ID + "|" + HEX_ID),
    Intent("list_executions", NOW, ("list_executions", "get_execution_status", "aggregate_responses"),
           r"\b(executions?|instructions?|commands?|jobs?|checks?|runs?|probes?)\b.{0,30}\b(i|we|you) (started|ran|"
           r"launched|dispatched|kicked off|sent)\b|\b(last|latest|recent|previous) (executions?|instructions?|"
           r"commands?|jobs?|runs?|patch checks?|probes?)\b|\bi (started|ran|launched|dispatched) (an?|the) "
           r"(execution|instruction|command|job|check|probe)\b|\bexecutions\b"),

    # -- incidents on one named host: the playbooks
    Intent("suspected_compromise", NOW, ("get_agent_details", "query_audit_log", "execute_instruction"),
           r"\b(compromis\w*|breach\w*|malware|ransomware|infected|intrusion|hacked|backdoor|suspicious|"
           r"indicators? of compromise)\b", playbook="suspected compromise"),
    Intent("agent_offline", NOW, ("get_agent_details", "query_audit_log"),
           r"\b(stopped reporting|offline|disconnected|unreachable|not responding|not reporting|lost contact|"
           r"no heartbeat|went dark|missing from)\b", host=True, playbook="agent offline"),
    Intent("last_seen", NOW, ("get_agent_details", "list_agents"),
           r"\blast (check(ed)?[ -]in|seen|heartbeat|contact|report(ed)?)\b|\bcheck(ed)? in\b", host=True),
    Intent("fleet_offline", NOW, ("list_agents", "get_fleet_posture_fast"),
           r"\b(stopped reporting|offline|disconnected|unreachable|not responding|not reporting|lost contact|"
           r"went dark|online|connected)\b"),

    # -- scope expressions: the language, a check, a preview
    Intent("discover_scope_kinds", NOW, ("discover_scope_kinds", "validate_scope"),
           r"\bhow (do|can|would) i (write|express|build|target|select)\b|\bscope (language|syntax|operators|"
           r"grammar|examples?)\b|\bwhat can a scope\b"),
    Intent("validate_scope", NOW, ("validate_scope", "preview_scope_targets"),
           r"\b(valid|parse|parses|syntax error|well-formed|correct)\b.*\b(scope|expression)\b|"
           r"\b(scope|expression)\b.*\b(valid|parse|parses|well-formed)\b"),
    Intent("preview_scope_targets", NOW, ("preview_scope_targets", "validate_scope"),
           r"\b(would|will|does|do)\b.{0,40}\b(hit|match|target|select|cover)\b|\bscope\b|\bexpression\b"),

    # -- digital experience (DEX, docs/dex.md): stored telemetry answers fleet-wide performance, app, network and
    #    signal questions at once, before any live probe (a question naming one host still gets the live probe)
    Intent("dex_app_versions", NOW, ("compare_app_perf_versions", "list_dex_perf_apps", "get_dex_app_perf"),
           r"\b(upgrade[ds]?|new version|after (the |we |our )?(update|upgrade|roll ?out|deploy\w*|patch\w*))\b.{0,80}"
           r"\b(slow\w*|sluggish|degrad\w*|cpu|memory|ram|perform\w*|regress\w*|worse)\b|\b(slow\w*|degrad\w*|"
           r"regress\w*|worse)\b.{0,80}\b(since|after) (the |we |our )?(upgrade|update|new version|roll ?out)\b",
           host=False, playbook="app degradation"),
    Intent("dex_app", NOW, ("list_dex_perf_apps", "get_dex_app_perf", "get_dex_group_app_perf"),
           r"\b(java|jvm|node(\.js)?|gateway|apps?|applications?|browsers?|chrome)\b.{0,60}\b(slow\w*|sluggish|"
           r"degrad\w*|cpu|memory|ram|hog\w*|leak\w*|perform\w*)\b|\b(slow\w*|degrad\w*|sluggish)\b.{0,40}\b(java|"
           r"jvm|node(\.js)?|apps?|applications?)\b", host=False, playbook="app degradation"),
    Intent("dex_database", NOW, ("list_dex_perf_devices", "get_dex_signal_detail", "get_dex_perf_fleet"),
           r"\b(database|db|postgres\w*|mysql|sql server|oracle db)\b.{0,60}\b(slow\w*|bottleneck\w*|latency|i/?o|"
           r"disk)\b", host=False, playbook="database bottleneck"),
    Intent("dex_network", NOW, ("get_network_fleet", "list_network_devices"),
           r"\b(latency|round[- ]trip|rtt|packet loss|retransmi\w*|jitter|choppy|call quality|meeting quality|"
           r"video calls?|network (quality|performance|is slow|slowness)|slow network|bandwidth|throughput)\b",
           host=False, playbook="collaboration quality"),
    Intent("dex_signals", NOW, ("list_dex_signals", "get_dex_signal_detail"),
           r"\b(crash(es|ed|ing)?|oom|out of memory|kernel panics?|bugchecks?|blue ?screens?|bsod|throttl\w*|"
           r"dirty shutdowns?|hung services?|dex signals?)\b", host=False),
    Intent("dex_perf", NOW, ("get_dex_perf_fleet", "list_dex_perf_devices", "get_dex_perf_cohorts"),
           r"\b(slow\w*|sluggish|laggy|high cpu|cpu (usage|load|pressure)|memory pressure|(high|low) memory|"
           r"disk latency|(device|machine|endpoint|fleet|laptop) performance|performance|worst (devices|machines|"
           r"laptops|endpoints))\b", host=False, playbook="slow devices"),

    # -- live probes: the agents answer now (execute_instruction, then poll)
    Intent("pending_reboot", LIVE, ("execute_instruction", "get_execution_status", "query_responses"),
           r"\b(pending reboot|reboot pending|need(s)?( a)? reboot|reboot required|awaiting (a )?reboot|"
           r"requires? (a )?restart)\b", playbook="pending reboot"),
    Intent("disk_full", LIVE, ("execute_instruction", "get_execution_status", "query_responses"),
           r"\b(disk (is )?full|out of (disk|space)|disk space|(low|no) (disk|space)|filling up|eating (the )?"
           r"(disk|space)|full disk|volume (is )?full)\b", playbook="disk full"),
    Intent("security_client", LIVE, ("execute_instruction", "preview_scope_targets", "query_responses"),
           r"\b(sensor|antivirus|anti-virus|edr|defender|crowdstrike|falcon|sentinelone|security (client|agent)|"
           r"endpoint protection)\b", playbook="endpoint security client outage"),
    Intent("live_probe", LIVE, ("execute_instruction", "get_execution_status", "query_responses"),
           r"\b(process(es)?|running on|is \S+ running|running right now|uptime|up since|since (its|the) last "
           r"boot|last boot|booted|disk|memory|ram|cpu|load|services?|daemon|hash(es)?|checksum|sha-?\d*|md5|"
           r"interfaces?|ip address(es)?|listening|ports?|open files|installed (packages|software)|"
           r"what do the (endpoints|machines|hosts) (show|say|report))\b"),

    # -- stored state: tags, groups, inventory, plugins, definitions, agents, the fleet
    Intent("get_tags", NOW, ("get_tags", "get_agent_details"), r"\btags?\b", host=True),
    Intent("search_agents_by_tag", NOW, ("search_agents_by_tag", "preview_scope_targets"),
           r"\btagged\b|\b(with|carrying|have|has) (the |a )?tag\b|\btag \S+=|\b\w+=\w+\b"),
    Intent("scope_by_attribute", NOW, ("preview_scope_targets", "list_agents"),
           r"\b(missing|without|lacking|no) (an? |the )?\S+ tag\b|\b(older|newer) than\b|\bversion (<|>|below|"
           r"above)\b|\b(windows|linux|macos|mac|darwin|ubuntu|debian|rhel)\b.{0,20}\b(workstations?|servers?|"
           r"machines?|hosts?|laptops?|desktops?|endpoints?|boxes|devices?)\b"),
    Intent("get_management_group", NOW, ("get_management_group", "list_management_groups"),
           r"\b(members?|who is|what is|which (machines|hosts|agents|servers) are)\b.{0,40}\bgroup\b|"
           r"\bin the \S+( \S+)? group\b"),
    Intent("list_management_groups", NOW, ("list_management_groups", "get_management_group"), r"\bgroups\b"),
    Intent("list_inventory_tables", NOW, ("list_inventory_tables", "query_inventory"),
           r"\b(kinds?|types?|tables?|what)\b.{0,20}\binventory\b|\binventory (tables|kinds|types|data)\b"),
    Intent("get_agent_inventory", NOW, ("get_agent_inventory", "get_agent_details"),
           r"\b(inventory|os (build|version|release)|hardware|installed|kernel|serial)\b", host=True),
    Intent("query_inventory", NOW, ("query_inventory", "list_inventory_tables"), r"\binventory\b"),
    Intent("discover_plugins", NOW, ("discover_plugins", "discover_instructions"),
           r"\b(plugins?|actions? (can|could) (i|we) run|what can (i|we) run|capabilit\w+ of the agents)\b"),
    Intent("list_definitions", NOW, ("list_definitions", "get_definition"),
           r"\b(instruction )?definitions?\b|\binstruction sets?\b"),
    Intent("get_agent_details", NOW, ("get_agent_details", "summarize_working_set"),
           r"\b(details?|everything|all you know|tell me about|info(rmation)? (on|about)|describe|look up)\b",
           host=True),
    Intent("quarantined", NOW, ("list_agents", "get_fleet_posture_fast"), r"\bquarantined\b"),
    Intent("fleet_posture", NOW, ("get_fleet_posture_fast", "summarize_working_set", "list_agents"),
           r"\b(how many|health|briefing|overview|summary|summari[sz]e|posture|os mix|state of the fleet|fleet)\b"),
    Intent("list_agents", NOW, ("list_agents", "get_fleet_posture_fast"),
           r"\b(agents?|endpoints?|devices?|machines?|hosts?|servers?|workstations?|laptops?|versions?)\b"),
    Intent("one_host", NOW, ("get_agent_details", "summarize_working_set"), HOST),
]


def names_host(q):
    return bool(re.search(HOST, q))


def classify(question):
    """An advisory first step: the intent of an operator's question, its category, the tool to call first
    (then what usually follows) and, for an incident, the playbook to read. Never runs anything."""
    q = " ".join(question.lower().split())
    host = names_host(q)
    for intent in INTENTS:
        matched = intent.matches(q, host)
        if matched:
            out = {"category": intent.category, "confidence": round(min(0.95, 0.55 + 0.1 * len(set(matched))), 2),
                   "matched_keywords": sorted({m.strip()[:64] for m in matched})[:8],
                   "suggested_tools": list(intent.tools), "intent": intent.name, "advisory": True}
            if intent.playbook:
                out["playbook"] = intent.playbook
            return out
    return {"category": "outside_yuzu_scope", "confidence": 0.3, "matched_keywords": [], "intent": "none",
            "suggested_tools": ["get_fleet_posture_fast", "discover_plugins"], "advisory": True}


PLAYBOOKS = {
    "agent offline": {
        "first_tool": "get_agent_details",
        "aliases": r"\b(offline|disconnected|stopped reporting|unreachable|not responding|lost contact)\b",
        "steps": ["get_agent_details for the agent: check connected and last_seen",
                  "query_audit_log action=agent. for recent enrolment or quarantine events",
                  "if other agents in its groups are also offline, suspect the network, not the agent"],
        "safety": ["Do not re-enrol or quarantine without a human approval."],
    },
    "pending reboot": {
        "first_tool": "execute_instruction",
        "aliases": r"\b(pending reboot|reboot pending|needs? (a )?reboot|reboot required|patch(ing)?)\b",
        "steps": ["execute_instruction plugin=reboot action=pending on the affected scope",
                  "get_execution_status until terminal, then query_responses",
                  "prepare_remediation_plan for agents reporting pending:true"],
        "safety": ["Rebooting is out of band: ask a human; yuzu only reports."],
    },
    "disk full": {
        "first_tool": "execute_instruction",
        "aliases": r"\b(disk|space|volume|filesystem)\b.*\b(full|low|out)\b|\bout of (disk|space)\b",
        "steps": ["execute_instruction plugin=disk action=usage on the agent",
                  "query_responses to read mount points above 90%",
                  "process.list to find large writers if needed"],
        "safety": ["Never delete files through script.run without an approval."],
    },
    "suspected compromise": {
        "first_tool": "get_agent_details",
        "aliases": r"\b(compromis\w*|breach\w*|malware|ransomware|infected|intrusion|hacked|suspicious)\b",
        "steps": ["get_agent_details and query_audit_log for the agent",
                  "execute_instruction process.list and network.interfaces",
                  "quarantine_device (supervised token, human approval) if confirmed"],
        "safety": ["Quarantine needs a supervised token and a human approval."],
    },
    "endpoint security client outage": {
        "first_tool": "execute_instruction",
        "aliases": r"\b(sensor|antivirus|edr|defender|crowdstrike|security (client|agent))\b",
        "steps": ["preview_scope_targets for the affected endpoints (by tag, group or OS)",
                  "execute_instruction service.status for the client's service on that scope",
                  "query_responses: stopped or missing services, then process.list on those agents"],
        "safety": ["Restarting or reinstalling the client is a change: it needs a human approval."],
    },
    # digital experience (docs/dex.md): the stored telemetry first, live probes to confirm (the most specific
    # first: an alias list is searched in this order)
    "collaboration quality": {
        "first_tool": "get_network_fleet",
        "aliases": r"\b(call|meeting|video|voice|collaboration)\b.*\b(quality|choppy|drop\w*|lag\w*)\b|"
                   r"\b(latency|packet loss|retransmi\w*|jitter)\b",
        "steps": ["get_network_fleet: RTT, retransmit % and throughput now, and how many devices report",
                  "list_network_devices metric=retrans (then rtt) with key/cohort_value for the site's group or tag",
                  "list_dex_perf_devices for the same devices: a busy CPU also breaks calls (under_pressure)",
                  "execute_instruction network.interfaces on the worst devices"],
        "safety": ["yuzu sees endpoints only: the meeting service and the WAN are connector gaps."],
    },
    "app degradation": {
        "first_tool": "list_dex_perf_apps",
        "aliases": r"\b(java|jvm|node|gateway|app|application)\b.*\b(slow|degrad\w*|leak\w*|cpu|memory)\b|"
                   r"\b(upgrade|new version)\b.*\b(slow\w*|worse|regress\w*)\b",
        "steps": ["list_dex_perf_apps: the app names with history (names only, as the process is called)",
                  "get_dex_app_perf app=<name>: CPU and working set per version and day",
                  "after an upgrade: compare_app_perf_versions app, group, baseline, candidate (evidence only)",
                  "get_dex_group_app_perf for one management group; then service.status / process.list live"],
        "safety": ["Rolling a version back is a change: it needs a human approval."],
    },
    "database bottleneck": {
        "first_tool": "list_dex_perf_devices",
        "aliases": r"\b(database|db|postgres\w*|mysql|sql)\b.*\b(slow|bottleneck|latency|io)\b",
        "steps": ["list_dex_perf_devices metric=disk_lat: the devices with the slowest disk IO",
                  "get_dex_signal_detail obs_type=perf.disk_latency_high and obs_type=storage.low",
                  "list_dex_perf_devices metric=commit on the database hosts (memory pressure)",
                  "execute_instruction disk.usage and process.list on the host"],
        "safety": ["Read-only: restarting the database is a change for its owners."],
    },
    "slow devices": {
        "first_tool": "get_dex_perf_fleet",
        "aliases": r"\b(slow|sluggish|laggy|high cpu|memory pressure|performance)\b",
        "steps": ["get_dex_perf_fleet: fleet CPU, memory commit and disk latency now (null = nobody reported)",
                  "list_dex_perf_devices metric=cpu (or commit, disk_lat): the worst devices first",
                  "get_dex_perf_cohorts key=model (or yuzu:os, yuzu:agent_version) to see whether one cohort is "
                  "worse; get_dex_perf_cohort_diff for two of them",
                  "list_dex_signals window=24h for perf.cpu_sustained / perf.memory_pressure episodes",
                  "execute_instruction process.list on the worst devices to name the process"],
        "safety": ["Read-only until a human approves a change (killing a process is a change)."],
    },
}


def playbook(scenario):
    """A playbook by its name, or the first whose aliases match the text (e.g. "web-03 went offline")."""
    key = " ".join(scenario.strip().lower().split())
    name = key if key in PLAYBOOKS else next((n for n, b in PLAYBOOKS.items() if re.search(b["aliases"], key)), None)
    if name is None:
        return {"found": False, "scenario": scenario[:2048], "known_scenarios": sorted(PLAYBOOKS)}
    book = {k: v for k, v in PLAYBOOKS[name].items() if k != "aliases"}
    return {"found": True, "scenario": name, **book, "known_scenarios": sorted(PLAYBOOKS)}


def summarize(principal, kind, ident=None, limit=25):
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
        raise rbac.denial(principal, "Execution", "Read")
    # Confined like get_execution_status and query_responses: another group's execution reads as absent.
    ex = visible_executions(principal).filter(pk=ident or "").first()
    if ex is None:
        raise NotFound(f"Execution not found: {ident}")
    rows = [{k: r[k] for k in ("agent_id", "status", "exit_code")}
            for r in query_responses(principal, execution_id=ex.id, limit=limit)["responses"]]
    return {"kind": kind, "narrative": f"Execution {ex.id} ({ex.plugin}.{ex.action}) is {ex.status}: "
                                       f"{ex.agents_responded}/{ex.agents_targeted} responded, "
                                       f"{ex.agents_failure} failed.", "items": rows, "resource_links": []}


GOLDEN_PACK = Path(__file__).resolve().parent / "golden_prompts" / "enterprise-it-v1.json"


@cache
def golden_pack():
    """The golden prompt pack (yuzu://golden-prompts/enterprise-it-v1), scored by bench/prompt_pack/run.py."""
    return json.loads(GOLDEN_PACK.read_text())


_routes = None


def routes():
    global _routes
    if _routes is None:
        doc = SchemaGenerator().get_schema(request=None, public=True)
        rows = []
        for path, ops in doc.get("paths", {}).items():
            for method, op in ops.items():
                rows.append({"method": method.upper(), "path": path, "summary": op.get("summary", "")})
        _routes = rows
    return {"routes": _routes, "count": len(_routes)}
