"""A schedule's secret parameters move into a sealed column (yuzu.secrets, docs/governance.md, secrets at rest):
add secrets_sealed, seal each existing schedule's secret values under the active KEK and leave them [redacted]
in ``parameters``."""

import json

from django.db import migrations, models

# The KEK registry (yuzu 0002) is migrated first: the dependency below.
from yuzu.plans import SENSITIVE_KEY_RE, redact
from yuzu.secrets import Where, seal, unseal


def _where(Schedule, pk):
    return Where("operations", Schedule._meta.db_table, "secrets_sealed", pk)


def seal_existing(apps, schema_editor):
    Schedule = apps.get_model("operations", "InstructionSchedule")
    for pk, params in Schedule.objects.values_list("pk", "parameters"):
        hidden = {k: v for k, v in (params or {}).items() if SENSITIVE_KEY_RE.search(k)}
        if hidden:
            Schedule.objects.filter(pk=pk).update(parameters=redact(params),
                                                  secrets_sealed=seal(json.dumps(hidden), _where(Schedule, pk)))


def unseal_existing(apps, schema_editor):
    Schedule = apps.get_model("operations", "InstructionSchedule")
    for pk, params, blob in Schedule.objects.exclude(secrets_sealed__isnull=True).values_list(
            "pk", "parameters", "secrets_sealed"):
        Schedule.objects.filter(pk=pk).update(
            parameters={**params, **json.loads(unseal(bytes(blob), _where(Schedule, pk)))})


class Migration(migrations.Migration):
    dependencies = [("operations", "0002_kill_switch_per_group"), ("yuzu", "0002_kek_versions")]

    operations = [
        migrations.AddField(
            model_name="instructionschedule", name="secrets_sealed",
            field=models.BinaryField(blank=True, editable=False, null=True,
                                     help_text="the secret parameters, envelope-encrypted (yuzu.secrets)")),
        migrations.AlterField(
            model_name="instructionschedule", name="parameters",
            field=models.JSONField(blank=True, default=dict, help_text="a secret's value is [redacted] here")),
        migrations.RunPython(seal_existing, unseal_existing),
    ]
