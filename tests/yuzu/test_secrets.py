"""Secrets at rest (yuzu.secrets, spec/governance.md §3): envelope encryption bound to where a blob lives, KEK
files checked against the database, rotation that re-wraps only the data keys, and failures with a class —
never an empty value."""

import os
import stat

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection

from yuzu import secrets
from yuzu.models import KekVersion
from yuzu.secrets import SecretError, Where

pytestmark = pytest.mark.django_db

HERE = Where("test", "t_table", "secret", 7)


def test_a_sealed_value_opens_only_where_it_was_sealed(settings):
    blob = secrets.seal("s3cr3t-value", HERE)
    assert b"s3cr3t-value" not in blob and secrets.unseal(blob, HERE) == b"s3cr3t-value"
    assert blob[0] == 1 and secrets.kek_version_of(blob) == 1
    assert secrets.seal("s3cr3t-value", HERE) != blob  # a fresh data key and nonces each time
    for elsewhere in (Where("test", "t_table", "secret", 8), Where("test", "t_table", "other", 7),
                      Where("test", "other", "secret", 7), Where("other", "t_table", "secret", 7),
                      Where("test", "t_table", "secret", "7")):
        with pytest.raises(SecretError) as exc:
            secrets.unseal(blob, elsewhere)
        assert exc.value.failure_class == "tag_mismatch"
    flipped = bytearray(blob)
    flipped[-1] ^= 1
    with pytest.raises(SecretError, match="does not open here"):
        secrets.unseal(bytes(flipped), HERE)
    for junk in (b"", b"\x01" * 20, b"\x02" + blob[1:], "text"):
        with pytest.raises(SecretError) as exc:
            secrets.unseal(junk, HERE)
        assert exc.value.failure_class == "malformed_blob"


def test_key_files_are_private_and_never_in_the_database(settings):
    secrets.seal("x", HERE)
    path = settings.YUZU_KEK_DIR / "secrets-kek-v1.key"
    assert stat.S_IMODE(os.stat(settings.YUZU_KEK_DIR).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    key = path.read_bytes()
    row = KekVersion.objects.get()
    assert row.kcv == secrets.check_value(key) and len(key) == 32
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {KekVersion._meta.db_table}")
        assert key.hex() not in repr(cursor.fetchall())


def test_rotation_rewraps_the_data_key_only(settings):
    blob = secrets.seal("rotate me", HERE)
    assert secrets.create_version() == 2 and secrets.active_version() == 2
    moved = secrets.rewrap(blob, HERE)
    assert secrets.kek_version_of(moved) == 2 and secrets.unseal(moved, HERE) == b"rotate me"
    assert moved[-len(b"rotate me"):] == blob[-len(b"rotate me"):]  # the same ciphertext under the same DEK
    assert secrets.unseal(blob, HERE) == b"rotate me"  # the old version still opens until it is retired
    assert secrets.kek_version_of(secrets.seal("new", HERE)) == 2


def test_a_missing_or_wrong_key_refuses_to_serve(settings):
    blob = secrets.seal("x", HERE)
    path = settings.YUZU_KEK_DIR / "secrets-kek-v1.key"
    key = path.read_bytes()
    path.write_bytes(bytes(32))
    secrets.forget_keys()
    with pytest.raises(SecretError) as exc:
        secrets.unseal(blob, HERE)
    assert exc.value.failure_class == "kek_corrupt"
    with pytest.raises(SystemCheckError, match="yuzu.E010"):
        call_command("check", databases=["default"])
    path.unlink()
    secrets.forget_keys()
    assert [p.split(":")[0] for p in secrets.problems()] == ["kek_unresolvable"]
    path.write_bytes(key)  # restored, but with the umask's mode: a key others can read is refused
    secrets.forget_keys()
    if stat.S_IMODE(os.stat(path).st_mode) & 0o077:
        assert [p.split(":")[0] for p in secrets.problems()] == ["kek_corrupt"]
    os.chmod(path, 0o600)
    secrets.forget_keys()
    assert secrets.problems() == [] and secrets.unseal(blob, HERE) == b"x"


def test_a_stale_key_file_is_never_overwritten(settings):
    settings.YUZU_KEK_DIR.mkdir(parents=True, exist_ok=True)
    (settings.YUZU_KEK_DIR / "secrets-kek-v1.key").write_bytes(b"k" * 32)  # a key the database does not know
    with pytest.raises(SecretError, match="already exists"):
        secrets.seal("x", HERE)
    assert (settings.YUZU_KEK_DIR / "secrets-kek-v1.key").read_bytes() == b"k" * 32
    assert not KekVersion.objects.exists()


def test_serve_refuses_to_start_when_the_keys_do_not_match(settings):
    secrets.seal("x", HERE)
    (settings.YUZU_KEK_DIR / "secrets-kek-v1.key").unlink()
    secrets.forget_keys()
    with pytest.raises(SystemCheckError, match="secrets at rest cannot be opened: kek_unresolvable"):
        call_command("serve", "--no-agent")


@pytest.mark.django_db(transaction=True)
def test_first_use_at_once_mints_one_version(settings):
    """Two processes sealing their first secret at once (the server and a test, CI on b39fd9f) both found no
    version, and the one that lost the race to the key file failed ``kek_corrupt``: locking the newest row locks
    nothing while the table is empty."""
    from tests.support.races import at_once

    for _ in range(3):
        KekVersion.objects.all().delete()
        for path in settings.YUZU_KEK_DIR.glob("secrets-kek-v*.key") if settings.YUZU_KEK_DIR.exists() else ():
            path.unlink()
        secrets.forget_keys()
        outcomes = at_once(*[secrets.active_version] * 4)
        assert outcomes == [("ok", 1)] * 4, outcomes
        assert list(KekVersion.objects.values_list("version", flat=True)) == [1]
        assert secrets.problems() == []
