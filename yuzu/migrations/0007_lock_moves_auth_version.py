"""An administrator's lock (yuzu.models.AccountLockout, ``manual``) keeps its user out of every face — API tokens,
OAuth access tokens, refreshes, streams — not only the admin sessions, so a cached principal depends on it: its
start and its end move the auth version (as the triggers of migration 0003 do for tokens, users and roles).

Only those: a failed sign-in writes the row too (its count, and after five a lock of its own that leaves tokens
alone), and anyone can make one for a known name — so a write moves the version only when it touches an
administrator's lock (before or after) and changes when it ends or whose it is. Row triggers with a WHEN clause."""

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

BUMP = "UPDATE yuzu_authversion SET n = n + 1 WHERE id = 1"


def _triggers(vendor: str) -> list[tuple[str, str, str]]:
    """(name, event, condition) on yuzu_accountlockout."""
    differs = "IS DISTINCT FROM" if vendor == "postgresql" else "IS NOT"
    return [
        ("lock_ins", "INSERT", "NEW.manual AND NEW.locked_until IS NOT NULL"),
        ("lock_upd", "UPDATE", f"(OLD.manual OR NEW.manual) AND (OLD.manual {differs} NEW.manual "
                               f"OR OLD.locked_until {differs} NEW.locked_until)"),
        ("lock_del", "DELETE", "OLD.manual"),
    ]


def install(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    vendor = schema_editor.connection.vendor
    for name, event, condition in _triggers(vendor):
        if vendor == "postgresql":  # (the function is migration 0003's)
            schema_editor.execute(f"CREATE TRIGGER yuzu_authv_{name} AFTER {event} ON yuzu_accountlockout FOR EACH ROW "
                                  f"WHEN ({condition}) EXECUTE FUNCTION yuzu_bump_auth_version()")
        elif vendor == "sqlite":
            schema_editor.execute(f"CREATE TRIGGER yuzu_authv_{name} AFTER {event} ON yuzu_accountlockout FOR EACH ROW "
                                  f"WHEN {condition} BEGIN {BUMP}; END")
        else:
            raise NotImplementedError(f"auth version triggers for {vendor}")


def uninstall(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    vendor = schema_editor.connection.vendor
    on = " ON yuzu_accountlockout" if vendor == "postgresql" else ""
    for name, _event, _condition in _triggers(vendor):
        schema_editor.execute(f"DROP TRIGGER IF EXISTS yuzu_authv_{name}{on}")


class Migration(migrations.Migration):

    dependencies = [
        ("yuzu", "0006_api_token_label"),
    ]

    operations = [
        migrations.RunPython(install, uninstall),
    ]
