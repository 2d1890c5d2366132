"""Profile.run_as: the OS user a worker runs as. Blank on every existing profile — the server's own user, which the
IsolationGuard now refuses for a real agent: an administrator sets run_as (docs/bridge.md, Isolating workers), or
a single-person workstation opts in with YUZU_BRIDGE_SAME_USER_WORKERS=1. The stand-in runs as before."""

import bridge.models
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('bridge', '0005_hook_token_off_argv'),
    ]

    operations = [
        migrations.AddField(
            model_name='profile',
            name='run_as',
            field=models.CharField(
                blank=True, max_length=32, validators=[bridge.models._validate_run_as],
                help_text="The OS user the worker runs as (blank: the server's own user). The IsolationGuard refuses "
                          "a real agent as the server's own user unless YUZU_BRIDGE_SAME_USER_WORKERS=1; a run_as "
                          "user needs the server to run as root and a cwd that user may enter (docs/bridge.md, "
                          "Isolating workers)."),
        ),
        migrations.AlterField(
            model_name='profile',
            name='cwd',
            field=models.CharField(
                blank=True, max_length=1024,
                help_text="Working directory (default: the bridge's repo; with run_as, that user's home)"),
        ),
    ]
