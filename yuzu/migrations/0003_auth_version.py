"""The auth version counter (yuzu.models.AuthVersion) and the triggers that move it."""

from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

# (table, event, columns): what a cached principal depends on. A new token or user changes no cached entry.
WATCHED = [
    ("yuzu_apitoken", "UPDATE OF owner_id, token_hash, expires_at, revoked_at, mcp_tier, scope_service, audience, "
                      "retire_at", "token_upd"),
    ("yuzu_apitoken", "DELETE", "token_del"),
    ("auth_user", "UPDATE OF username, is_active, is_superuser", "user_upd"),
    ("auth_user", "DELETE", "user_del"),
    ("yuzu_roleassignment", "INSERT", "assign_ins"),
    ("yuzu_roleassignment", "UPDATE", "assign_upd"),
    ("yuzu_roleassignment", "DELETE", "assign_del"),
    ("yuzu_rolepermission", "INSERT", "perm_ins"),
    ("yuzu_rolepermission", "UPDATE", "perm_upd"),
    ("yuzu_rolepermission", "DELETE", "perm_del"),
]
BUMP = "UPDATE yuzu_authversion SET n = n + 1 WHERE id = 1"


def install(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    apps.get_model("yuzu", "AuthVersion").objects.using(schema_editor.connection.alias).create(id=1, n=0)
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute("CREATE OR REPLACE FUNCTION yuzu_bump_auth_version() RETURNS trigger LANGUAGE plpgsql "
                              f"AS $$ BEGIN {BUMP}; RETURN NULL; END $$")
        for table, event, name in WATCHED:
            schema_editor.execute(f"CREATE TRIGGER yuzu_authv_{name} AFTER {event} ON {table} FOR EACH STATEMENT "
                                  "EXECUTE FUNCTION yuzu_bump_auth_version()")
    elif vendor == "sqlite":
        for table, event, name in WATCHED:
            schema_editor.execute(f"CREATE TRIGGER yuzu_authv_{name} AFTER {event} ON {table} BEGIN {BUMP}; END")
    else:
        raise NotImplementedError(f"auth version triggers for {vendor}")


def uninstall(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    for _table, _event, name in WATCHED:
        on = f" ON {_table}" if schema_editor.connection.vendor == "postgresql" else ""
        schema_editor.execute(f"DROP TRIGGER IF EXISTS yuzu_authv_{name}{on}")


class Migration(migrations.Migration):

    dependencies = [
        ("yuzu", "0002_kek_versions"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        migrations.CreateModel(
            name="AuthVersion",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("n", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RunPython(install, uninstall),
    ]
