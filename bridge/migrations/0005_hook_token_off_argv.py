"""The claude-worker's hook command no longer puts the worker's token on curl's command line (readable by every
user on the host with ``ps``): profiles seeded before — seeds never overwrite a profile — get the new command
wherever the old one stands in their argv. Nothing else of a profile changes."""

import json

from django.db import migrations

OLD = ('curl -s -m 3 -X POST -H "Authorization: Bearer $YUZU_BRIDGE_TOKEN" -H "Content-Type: application/json" '
       '--data-binary @- "$YUZU_BRIDGE_EVENTS_URL" >/dev/null 2>&1 || true')
NEW = ('curl -s -m 3 -X POST -H @/dev/fd/3 -H "Content-Type: application/json" --data-binary @- '
       '"$YUZU_BRIDGE_EVENTS_URL" >/dev/null 2>&1 3<<EOF || true\nAuthorization: Bearer $YUZU_BRIDGE_TOKEN\nEOF\n')


def rewrite_hook_command(apps, schema_editor):
    Profile = apps.get_model("bridge", "Profile")
    old, new = json.dumps(OLD)[1:-1], json.dumps(NEW)[1:-1]  # as the command stands inside the --settings JSON
    for profile in Profile.objects.all():
        argv = profile.argv if isinstance(profile.argv, list) else []
        moved = [a.replace(old, new) if isinstance(a, str) else a for a in argv]
        if moved != argv:
            Profile.objects.filter(pk=profile.pk).update(argv=moved)


class Migration(migrations.Migration):

    dependencies = [
        ("bridge", "0004_resend_marks"),
    ]

    operations = [
        migrations.RunPython(rewrite_hook_command, migrations.RunPython.noop),
    ]
