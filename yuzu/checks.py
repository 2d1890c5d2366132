"""Start-up checks (Django system checks: `serve`, `migrate` and `bootstrap` run them)."""

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError

from .secrets import problems

SHOWN = 5


def _loose(path: Path) -> bool:
    """True if other users (group or others) have any access to ``path`` (a symlink's target is not followed)."""
    try:
        return bool(os.lstat(path).st_mode & 0o077)
    except FileNotFoundError:
        return False


def loose_var_paths() -> list[Path]:
    """var/ and everything in it that is not private (0700 directories, 0600 files), plus an embedded database
    kept elsewhere. The collected static files (STATIC_ROOT), public by nature, are not looked at."""
    var = Path(settings.VAR_DIR)
    static = Path(settings.STATIC_ROOT)
    found = []
    if var.is_dir():
        if _loose(var):
            found.append(var)
        for root, dirs, files in os.walk(var):
            dirs[:] = [d for d in dirs if Path(root, d) != static]
            found += [Path(root, name) for name in sorted(dirs + files) if _loose(Path(root, name))]
    if settings.SQLITE_FILE is not None and var not in settings.SQLITE_FILE.parents:
        db = settings.SQLITE_FILE
        found += [p for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")) if _loose(p)]
    return found


@register(Tags.security)
def var_permissions(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    loose = loose_var_paths()
    if not loose:
        return []
    shown = ", ".join(f"{p} ({stat.filemode(os.lstat(p).st_mode)})" for p in loose[:SHOWN])
    more = f" and {len(loose) - SHOWN} more" if len(loose) > SHOWN else ""
    return [Warning(
        f"{len(loose)} path(s) holding yuzu's database, secret key or agent state can be read by other users: "
        f"{shown}{more}",
        hint=f"make them private: chmod -R go-rwx {settings.VAR_DIR} (new installs are created that way; yuzu "
             "does not change an existing install's modes itself)",
        id="yuzu.W001")]


@register(Tags.security, Tags.database, deploy=False)
def kek_trusted(app_configs: Sequence[AppConfig] | None, databases: Sequence[str] | None = None,
                **kwargs: Any) -> list[CheckMessage]:
    """Every KEK version the database knows must resolve to a matching key file, or sealed secrets would be
    unreadable (or a wrong key used): the server refuses to start. Only when the database is being checked."""
    if not databases:
        return []
    try:
        found = problems()
    except DatabaseError:  # not migrated yet: nothing is sealed
        return []
    return [Error(f"secrets at rest cannot be opened: {p}", id="yuzu.E010",
                  hint=f"restore the key directory ({settings.YUZU_KEK_DIR}) every server process shares; never "
                       "delete a key file while the database still names its version (docs/governance.md)")
            for p in found]
