"""A profile's env (often API credentials) moves into a sealed column (yuzu.secrets, spec/governance.md §3):
add env_sealed, seal every existing env under the active KEK, drop the plaintext column."""

import json

from django.db import migrations, models

# The KEK registry (yuzu 0002) is migrated first: the dependency below.
from yuzu.secrets import Where, seal, unseal


def seal_existing(apps, schema_editor):
    Profile = apps.get_model("bridge", "Profile")
    for pk, env in Profile.objects.values_list("pk", "env"):
        if env:
            blob = seal(json.dumps(env, sort_keys=True), Where("bridge", Profile._meta.db_table, "env_sealed", pk))
            Profile.objects.filter(pk=pk).update(env_sealed=blob)


def unseal_existing(apps, schema_editor):
    Profile = apps.get_model("bridge", "Profile")
    for pk, blob in Profile.objects.exclude(env_sealed__isnull=True).values_list("pk", "env_sealed"):
        env = json.loads(unseal(blob, Where("bridge", Profile._meta.db_table, "env_sealed", pk)))
        Profile.objects.filter(pk=pk).update(env=env)


class Migration(migrations.Migration):
    dependencies = [("bridge", "0002_status_choices"), ("yuzu", "0002_kek_versions")]

    operations = [
        migrations.AddField(model_name="profile", name="env_sealed",
                            field=models.BinaryField(blank=True, editable=False, null=True, help_text=(
                                "the worker's environment (``env``), sealed with yuzu.secrets: it often holds API "
                                "credentials, so a database dump never shows it"))),
        migrations.RunPython(seal_existing, unseal_existing),
        migrations.RemoveField(model_name="profile", name="env"),
    ]
