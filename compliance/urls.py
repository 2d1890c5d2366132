from django.urls import path

from . import api

urlpatterns = [
    path("policy-fragments", api.fragments_view),
    path("policy-fragments/<str:fragment_id>", api.fragment_detail),
    path("policies", api.policies_view),
    path("policies/invalidate-all", api.policies_invalidate_all),
    path("policies/<str:policy_id>", api.policy_detail),
    path("policies/<str:policy_id>/enable", api.policy_enable),
    path("policies/<str:policy_id>/disable", api.policy_disable),
    path("policies/<str:policy_id>/evaluate", api.policy_evaluate),
    path("policies/<str:policy_id>/remediate", api.policy_remediate),
    path("policies/<str:policy_id>/invalidate", api.policy_invalidate),
    path("compliance", api.compliance_view),
    path("compliance/<str:policy_id>", api.compliance_detail),
    path("compliance/<str:policy_id>/summary", api.compliance_summary),
    path("guaranteed-state/rules", api.rules_view),
    path("guaranteed-state/rules/<str:rule_id>", api.rule_detail),
    path("guaranteed-state/push", api.rules_push),
    path("guaranteed-state/events", api.events_view),
    path("guaranteed-state/status", api.status_view),
    path("guaranteed-state/status/<str:agent_id>", api.agent_status_view),
    path("guaranteed-state/schemas", api.schemas_view),
]
