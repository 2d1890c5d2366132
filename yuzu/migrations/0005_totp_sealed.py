"""Authenticator seeds are sealed (yuzu.secrets, spec/governance.md §3): yuzu's own TOTP device replaces
django-otp's, whose ``key`` column held every seed in hex. Each existing django-otp device moves here with its
seed sealed — same user, name, confirmation, drift, last used code (a code used before the upgrade is still
refused) and throttling — then django-otp's table and its migration records go, so no plaintext copy is left
behind and the TOTP plugin, which is no longer installed, could be installed afresh.

Going back drops the sealed devices: each user sets theirs up again (the seeds are never written back in clear).
"""

from datetime import UTC, datetime
from typing import Any

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# The KEK registry (yuzu 0002) is migrated first: the dependency below.
from yuzu.secrets import Where, seal

LEGACY = "otp_totp_totpdevice"
COPIED = ("user_id", "name", "confirmed", "step", "t0", "digits", "tolerance", "drift", "last_t",
          "throttling_failure_timestamp", "throttling_failure_count", "created_at", "last_used_at")


def seal_legacy_devices(apps: Any, schema_editor: Any) -> None:
    """Move django-otp's TOTP devices (plaintext hex ``key``) into yuzu_totpdevice, sealed; drop the old table."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if LEGACY not in connection.introspection.table_names(cursor):
            return
        present = {c.name for c in connection.introspection.get_table_description(cursor, LEGACY)}
        columns = [c for c in COPIED if c in present]
        quote = connection.ops.quote_name
        cursor.execute(f"SELECT {quote('key')}, {', '.join(quote(c) for c in columns)} FROM {quote(LEGACY)} "
                       f"ORDER BY {quote('id')}")
        rows = cursor.fetchall()
    Device = apps.get_model("yuzu", "TOTPDevice")
    for key, *values in rows:
        # SQLite's driver hands a stored (UTC) timestamp back naive
        fields = {name: value.replace(tzinfo=UTC) if isinstance(value, datetime) and value.tzinfo is None else value
                  for name, value in zip(columns, values, strict=True)}
        device = Device.objects.create(key_sealed=b"", **fields)
        blob = seal(bytes.fromhex(key), Where("yuzu", Device._meta.db_table, "key_sealed", device.pk))
        # created_at again: auto_now_add stamped the copy with today
        Device.objects.filter(pk=device.pk).update(key_sealed=blob, created_at=fields.get("created_at"))
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {connection.ops.quote_name(LEGACY)}")
        cursor.execute("DELETE FROM django_migrations WHERE app = %s", ["otp_totp"])


class Migration(migrations.Migration):

    dependencies = [
        ('yuzu', '0004_lockout_manual'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='TOTPDevice',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(help_text='The human-readable name of this device.', max_length=64)),
                ('confirmed', models.BooleanField(default=True, help_text='Is this device ready for use?')),
                ('throttling_failure_timestamp', models.DateTimeField(blank=True, default=None, help_text='A timestamp of the last failed verification attempt. Null if last attempt succeeded.', null=True)),
                ('throttling_failure_count', models.PositiveIntegerField(default=0, help_text='Number of successive failed attempts.')),
                ('created_at', models.DateTimeField(auto_now_add=True, help_text='The date and time when this device was initially created in the system.', null=True)),
                ('last_used_at', models.DateTimeField(blank=True, help_text='The most recent date and time this device was used.', null=True)),
                ('key_sealed', models.BinaryField(help_text='the TOTP seed, sealed with yuzu.secrets (bound to this row): a dump never shows it')),
                ('step', models.PositiveSmallIntegerField(default=30, help_text='The time step in seconds.')),
                ('t0', models.BigIntegerField(default=0, help_text='The Unix time at which to begin counting steps.')),
                ('digits', models.PositiveSmallIntegerField(choices=[(6, 6), (8, 8)], default=6, help_text='The number of digits to expect in a token.')),
                ('tolerance', models.PositiveSmallIntegerField(default=1, help_text='The number of time steps in the past or future to allow.')),
                ('drift', models.SmallIntegerField(default=0, help_text='The number of time steps the prover is known to deviate from our clock.')),
                ('last_t', models.BigIntegerField(default=-1, help_text='The t value of the latest verified token. The next token must be at a higher time step.')),
                ('user', models.ForeignKey(help_text='The user that this device belongs to.', on_delete=django.db.models.deletion.CASCADE, to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'verbose_name': 'TOTP device',
                'abstract': False,
            },
        ),
        migrations.RunPython(seal_legacy_devices, migrations.RunPython.noop),
    ]
