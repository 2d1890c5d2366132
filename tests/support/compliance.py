"""Compliance test helpers: a fragment and a policy document, agents, and answers to a policy's runs."""

import json

from django.test import Client

from compliance.models import Policy, PolicyFragment
from fleet.models import Agent, AgentState, Execution, Response

FRAGMENT = """apiVersion: yuzu.io/v1alpha1
kind: PolicyFragment
metadata:
  name: marker-present
  description: a marker file must exist
spec:
  check:
    plugin: file
    action: stat
    parameters: {path: "${path}"}
    compliance: "result.exists && !result.world_writable"
  fix:
    plugin: script
    action: run
    parameters: {argv: '["touch", "${path}"]'}
"""
POLICY = """apiVersion: yuzu.io/v1alpha1
kind: Policy
metadata: {name: marker}
spec:
  fragment: marker-present
  triggers: [{type: interval, interval_seconds: 120}, {type: startup}, {type: file_change, path: /tmp}]
  inputs: {path: /tmp/marker}
"""


def admin_client(mint, role="Administrator", tier=""):
    raw = mint("comp-admin" if role == "Administrator" else f"comp-{role.lower()}", role=role, tier=tier)
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def agents(*ids, connected=True):
    return [Agent.objects.create(agent_id=a, hostname=f"{a}.example", os="linux", connected=connected) for a in ids]


def make_policy(text=POLICY, fragment=FRAGMENT):
    if not PolicyFragment.objects.filter(name="marker-present").exists():
        PolicyFragment().apply_yaml(fragment).save()
    return Policy.from_yaml(text)


def answer(run, agent_id, status=AgentState.SUCCESS, output=None, error=""):
    Response.objects.create(execution_id=run.execution_id, agent_id=agent_id, instruction_id="x",
                            status=status, output=json.dumps(output) if output is not None else "",
                            error_detail=error)


def nothing_written():
    return not (PolicyFragment.objects.exists() or Policy.objects.exists() or Execution.objects.exists())
