"""How policies are evaluated (docs/compliance.md, "Evaluation"): each due policy's check instruction goes out
through the normal execution path (fleet.executions.launch: one Execution, audited, with progress events), and
a later tick reads the answers and writes one verdict per agent.

- ``tick`` (Celery beat, every YUZU_COMPLIANCE_TICK_S, default 10 s): first collect every run whose execution
  has finished or whose grace window (15 s) has passed, then dispatch every due policy. A policy is claimed
  before its dispatch (Policy.claim, one conditional UPDATE), and a run before its verdicts are written
  (PolicyRun.claim_collection): two workers never evaluate one policy twice in an interval, nor write one
  run's verdicts twice.
- Verdicts: no answer within the grace window → unknown; a failed, timed-out or rejected command → error;
  otherwise the CEL expression over the answer's JSON (``result``): true → compliant, false → non_compliant,
  anything else (an evaluation error, a non-boolean, an empty expression) → error.
- Remediation is never automatic: ``remediate`` dispatches the fix to non-compliant agents and marks them
  fixing in the same transaction (a dispatch that fails uses up no attempt); collecting the fix dispatches
  the verify step (the post-check, or the check again), whose verdict ends the attempt. An agent still
  non-compliant after MAX_FIX_ATTEMPTS fixes is in error."""

import json
import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from fleet.executions import Order, gate, launch
from fleet.models import Agent, AgentState, Execution, Response
from yuzu.errors import YuzuError
from yuzu.metrics import POLICY_EVAL_ERRORS, POLICY_VERDICTS

from .documents import DocumentError, evaluate, result_value
from .models import MAX_FIX_ATTEMPTS, Policy, PolicyAgentStatus, PolicyRun, PolicyTrigger

log = logging.getLogger("yuzu.compliance")
Status = PolicyAgentStatus.Status
GRACE_S = 15
COMMAND_EXPIRES_S = 60
FIX_STALE = timedelta(minutes=5)  # longer than a fix and its verify can take
RESULT_BYTES = 4096  # of an answer's output kept in check_result


def grace():
    return timedelta(seconds=float(getattr(settings, "YUZU_COMPLIANCE_GRACE_S", GRACE_S)))


@dataclass(frozen=True)
class Actor:
    """Who a scheduled dispatch is recorded as (an Execution's dispatched_by, the audit row's principal)."""

    name: str


SYSTEM = Actor("system:compliance")


def conflict(message, remediation=None):
    return YuzuError(message, status=409, rpc_code=-32602, remediation=remediation)


def dispatch(policy, phase, agent_ids, actor=SYSTEM, cid=""):
    """Send the phase's instruction to ``agent_ids`` through the execution path; returns the PolicyRun."""
    try:
        plugin, action, params, expr = policy.fragment.step(phase, policy.inputs())
    except DocumentError as exc:  # the fragment changed under the policy (the admin refuses that; a safety net)
        raise conflict(f"the policy cannot be dispatched: {exc.message}", "fix the policy's inputs") from None
    # the agents a group's kill switch holds back are not this run's (gate raises when it holds them all)
    order = gate(Order(plugin, action, params, sorted(agent_ids), expires_in=COMMAND_EXPIRES_S))
    with transaction.atomic():
        receipt = launch(actor, order, cid=cid, definition_id=f"policy/{policy.id}/{phase}"[:128])
        return PolicyRun.objects.create(policy=policy, phase=phase, execution_id=receipt["execution_id"],
                                        agent_ids=order.targets, expression=expr)


def evaluate_now(policy, actor=SYSTEM, cid="", agent_ids=None):
    """Dispatch the policy's check now (claiming this interval), to ``agent_ids`` ∩ its targets if given.
    Raises 409 when no target is reachable."""
    targets = policy.reachable_targets()
    if agent_ids is not None:
        targets = sorted(set(targets) & set(agent_ids))
    if not targets:
        raise conflict("no matching agents: none of the policy's targets is connected and unquarantined",
                       "check the policy's scope or management groups (GET /api/v1/policies/{id})")
    policy.claim(timezone.now(), force=True)
    return dispatch(policy, PolicyRun.Phase.CHECK, targets, actor, cid)


def remediate(policy, agent_ids=None, actor=SYSTEM, cid=""):
    """Dispatch the fix to the policy's non-compliant agents (``agent_ids`` ∩ them, if given) with attempts
    left; 409 when the fragment has no fix, a fix is in flight, or no agent qualifies."""
    if not policy.fragment.remediation_available:
        raise conflict("remediation not available: the policy's fragment has no fix step",
                       "add spec.fix to the PolicyFragment")
    reachable = set(policy.reachable_targets())
    with transaction.atomic():
        rows = PolicyAgentStatus.objects.select_for_update().filter(policy=policy)
        if agent_ids is not None:
            rows = rows.filter(agent_id__in=agent_ids)
        rows = list(rows)
        fixing = [r for r in rows if r.status == Status.FIXING]
        todo = [r for r in rows if r.status == Status.NON_COMPLIANT and r.fix_attempts < MAX_FIX_ATTEMPTS
                and r.agent_id in reachable]
        if fixing or not todo:
            raise conflict("remediation already in flight or retry cap reached for this policy",
                           "wait for the running fix to be verified, or evaluate the policy again")
        ids = [r.agent_id for r in todo]
        run = dispatch(policy, PolicyRun.Phase.FIX, ids, actor, cid)  # first: a failed dispatch costs no attempt
        reached = set(run.agent_ids)
        todo = [r for r in todo if r.agent_id in reached]  # one a kill switch held back costs no attempt either
        now = timezone.now()
        for r in todo:
            r.status, r.fix_attempts, r.last_fix_at = Status.FIXING, r.fix_attempts + 1, now
        PolicyAgentStatus.objects.bulk_update(todo, ["status", "fix_attempts", "last_fix_at"])
    return run


# --- collection ------------------------------------------------------------------------------------

def _answer(r):
    out = (r.output or "")[:RESULT_BYTES]
    return {"status": AgentState(r.status).name, "output": out, "exit_code": r.exit_code,
            "error": r.error_detail or None}


def _verdict(run, response):
    """(status, check_result) of one agent's answer to a check or verify run."""
    base = {"phase": run.phase, "execution_id": run.execution_id}
    if response is None:
        return Status.UNKNOWN, {**base, "reason": "no reply within the grace window"}
    answer = _answer(response)
    if response.status != AgentState.SUCCESS:
        return Status.ERROR, {**base, **answer, "reason": f"the command ended {answer['status']}"}
    try:
        value = result_value(response.output)
    except RecursionError:  # the agent's text, nested past the parser's stack: its verdict, not the whole run's
        return Status.ERROR, {**base, **answer, "reason": "the answer is JSON nested too deeply to read"}
    ok, detail = evaluate(run.expression, value)
    if ok is None:
        return Status.ERROR, {**base, **answer, "reason": detail}
    return (Status.COMPLIANT if ok else Status.NON_COMPLIANT), {**base, "result": value if len(
        json.dumps(value, default=str)) <= RESULT_BYTES else answer["output"]}


def collect(run, now=None):
    """Write the verdicts of one finished (or overdue) run, once: the run is claimed in the same transaction
    as its verdicts, so a failure leaves it for the next tick and a concurrent collector writes nothing.
    Returns how many agents it concerned (0 when another collector had it)."""
    now = now or timezone.now()
    answers = {r.agent_id: r for r in Response.objects.filter(execution_id=run.execution_id,
                                                              status__in=Response.TERMINAL)}
    verify = []
    with transaction.atomic():
        if not run.claim_collection(now):
            return 0
        alive = set(Agent.objects.filter(pk__in=run.agent_ids).values_list("pk", flat=True))
        # Every verdict row exists before it is locked (inserted in one order, a concurrent insert waited for):
        # two runs of one policy collected at once each found no row for a new agent, and the second insert
        # failed the whole collection on the unique (policy, agent).
        PolicyAgentStatus.objects.bulk_create([PolicyAgentStatus(policy_id=run.policy_id, agent_id=agent_id)
                                               for agent_id in sorted(alive)], ignore_conflicts=True)
        rows = {r.agent_id: r for r in PolicyAgentStatus.objects.select_for_update().filter(
            policy_id=run.policy_id, agent_id__in=run.agent_ids)}
        for agent_id in run.agent_ids:
            if agent_id not in alive:
                continue  # deleted since the dispatch
            row = rows[agent_id]
            response = answers.get(agent_id)
            if run.phase == PolicyRun.Phase.FIX:
                if response is not None and response.status == AgentState.SUCCESS:
                    verify.append(agent_id)
                    continue
                POLICY_EVAL_ERRORS.labels("fix").inc()
                row.status = Status.ERROR if row.fix_attempts >= MAX_FIX_ATTEMPTS else Status.NON_COMPLIANT
                row.check_result = {"phase": "fix", "execution_id": run.execution_id,
                                    "reason": "the fix did not succeed" if response else "no reply to the fix",
                                    **(_answer(response) if response else {})}
            else:
                if run.phase == PolicyRun.Phase.CHECK and row.status == Status.FIXING:
                    continue  # the fix in flight owns the row; its verify step writes the verdict
                status, result = _verdict(run, response)
                if run.phase == PolicyRun.Phase.VERIFY and status == Status.NON_COMPLIANT and \
                        row.fix_attempts >= MAX_FIX_ATTEMPTS:
                    status, result = Status.ERROR, {**result, "reason": f"still non-compliant after "
                                                                        f"{row.fix_attempts} fix attempts"}
                if status == Status.ERROR:
                    POLICY_EVAL_ERRORS.labels(run.phase).inc()
                row.status, row.check_result, row.last_check_at = status, result, now
                if status == Status.COMPLIANT:
                    row.fix_attempts = 0
            POLICY_VERDICTS.labels(row.status).inc()
            row.save()
    if verify:
        try:
            dispatch(run.policy, PolicyRun.Phase.VERIFY, verify)
        except Exception:
            log.exception("the verify step of policy %s could not be dispatched", run.policy_id)
            PolicyAgentStatus.objects.filter(policy_id=run.policy_id, agent_id__in=verify,
                                             status=Status.FIXING).update(status=Status.UNKNOWN)
    return len(run.agent_ids)


def ready_runs(now):
    """Runs not yet collected whose execution is over, or whose grace window has passed."""
    return PolicyRun.objects.filter(collected_at__isnull=True).filter(
        Q(execution__status__in=Execution.TERMINAL) | Q(execution__isnull=True)
        | Q(started_at__lte=now - grace())).select_related("policy__fragment")


def tick(now=None):
    """One evaluator tick: collect, then dispatch what is due. Returns (runs collected, policies dispatched)."""
    now = now or timezone.now()
    collected = 0
    for run in ready_runs(now):
        try:
            collected += bool(collect(run, now))
        except Exception:  # left uncollected: the next tick tries again
            log.exception("collecting run %s of policy %s failed", run.pk, run.policy_id)
    # Recovery (a worker that died mid-fix, a restart): a fix nobody will verify any more leaves its rows
    # unknown, to be checked again.
    PolicyAgentStatus.objects.filter(status=Status.FIXING, last_fix_at__lt=now - FIX_STALE).update(
        status=Status.UNKNOWN)
    dispatched = 0
    for policy in Policy.objects.due(now).select_related("fragment"):
        try:
            targets = policy.reachable_targets()
            if policy.claim(now) and targets:
                dispatch(policy, PolicyRun.Phase.CHECK, targets)
                dispatched += 1
        except YuzuError as exc:  # refused (a kill switch, a store fault): said once per interval, no traceback
            log.warning("policy %s was not dispatched: %s", policy.pk, exc.message)
            POLICY_EVAL_ERRORS.labels("check").inc()
        except Exception:  # one broken policy must not stop the others
            log.exception("evaluating policy %s failed", policy.pk)
            POLICY_EVAL_ERRORS.labels("check").inc()
    return collected, dispatched


def on_agent_connected(agent_id):
    """``startup`` triggers: check the agent against each enabled policy that has one and targets it."""
    policies = Policy.objects.filter(enabled=True, triggers__trigger_type=PolicyTrigger.Type.STARTUP).distinct()
    for policy in policies.select_related("fragment"):
        try:
            if policy.targets().filter(pk=agent_id, quarantined=False).exists():
                dispatch(policy, PolicyRun.Phase.CHECK, [agent_id])
        except Exception:
            log.exception("the startup check of policy %s on %s failed", policy.pk, agent_id)
