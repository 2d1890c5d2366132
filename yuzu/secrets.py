"""Secrets at rest: envelope encryption (spec/governance.md §3, ADR-0010).

No recoverable secret is written to a database column in plaintext: it is **sealed**. Every seal draws a fresh
32-byte data key (DEK), encrypts the value with it (AES-256-GCM), and wraps the DEK with the current
key-encryption key (KEK), also AES-256-GCM. The blob names the KEK version it was wrapped with::

    ver(u8=1) | kek_version(u32 BE) | wrap_nonce(12) | wrapped_dek(32) | wrap_tag(16)
              | data_nonce(12) | data_tag(16) | ciphertext

Both encryptions are bound to where the blob lives — (store, table, column, row pk) as associated data, each
field u32-BE length-prefixed, an integer pk as 8 bytes BE; the wrap also binds the KEK version — so a blob
copied to another row or column does not open, and rotating the KEK re-wraps only the DEK (``rewrap``).

KEKs are 32 random bytes in files ``secrets-kek-v<N>.key`` (0600) in a 0700 directory (``YUZU_KEK_DIR``,
default ``var/keys``), written temp → fsync → rename, never stored in the database, logged or exported. The
database holds only each version's check value (``KekVersion``: SHA-256 of the key). A version the database
knows whose file is missing or does not match refuses to serve (the system check ``yuzu.E010``), and a
failed decryption is an error with a class, never an empty value.

Apps register their sealed columns with ``sealed_column`` so a KEK rotation can re-wrap every one of them.
"""

from __future__ import annotations

import hashlib
import os
import secrets as _random
import struct
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from django.db import connection, models, transaction

from .models import KekVersion, TOTPDevice

BLOB_VERSION = 1
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
_HEADER = struct.Struct(">BI")
_WRAP_END = _HEADER.size + NONCE_BYTES + KEY_BYTES + TAG_BYTES
_DATA_START = _WRAP_END + NONCE_BYTES + TAG_BYTES


class SecretError(Exception):
    """A sealed secret could not be opened, or the keys cannot be trusted. ``failure_class`` is one of
    tag_mismatch, kek_unresolvable, kek_corrupt, malformed_blob."""

    def __init__(self, failure_class: str, message: str):
        super().__init__(message)
        self.failure_class = failure_class


@dataclass(frozen=True)
class Where:
    """Where a sealed blob lives: it opens only there."""

    store: str
    table: str
    column: str
    pk: str | int

    def aad(self, kek_version: int | None = None) -> bytes:
        pk = struct.pack(">q", self.pk) if isinstance(self.pk, int) else str(self.pk).encode()
        fields = [bytes([BLOB_VERSION]), self.store.encode(), self.table.encode(), self.column.encode(), pk]
        if kek_version is not None:
            fields.append(struct.pack(">I", kek_version))
        return b"".join(struct.pack(">I", len(f)) + f for f in fields)


# --- the keys --------------------------------------------------------------------------------------

_lock = threading.Lock()
_keys: dict[int, bytes] = {}


def kek_dir() -> Path:
    return Path(getattr(settings, "YUZU_KEK_DIR", "") or settings.VAR_DIR / "keys")


def _key_path(version: int) -> Path:
    return kek_dir() / f"secrets-kek-v{version}.key"


def check_value(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()


def _write_key(version: int, key: bytes) -> None:
    directory = kek_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    path = _key_path(version)
    if path.exists():
        raise SecretError("kek_corrupt", f"{path} already exists but the database does not know version {version}; "
                                         "move stale key files out of the key directory first")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".kek-")  # 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(key)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load(version: int) -> bytes:
    with _lock:
        if version in _keys:
            return _keys[version]
    row = KekVersion.objects.filter(pk=version).first()
    if row is None:
        raise SecretError("kek_unresolvable", f"KEK version {version} is not registered in this database")
    if row.retired_at is not None:
        raise SecretError("kek_unresolvable", f"KEK version {version} is retired")
    path = _key_path(version)
    try:
        mode = path.stat().st_mode & 0o077
        key = path.read_bytes()
    except OSError:
        raise SecretError("kek_unresolvable", f"the key file of KEK version {version} is missing from {kek_dir()} "
                                              "(every server process must see the same key directory)") from None
    if mode:
        raise SecretError("kek_corrupt", f"the key file of KEK version {version} ({path}) is readable by others: "
                                         "it must be mode 0600")
    if len(key) != KEY_BYTES or check_value(key) != row.kcv:
        raise SecretError("kek_corrupt", f"the key file of KEK version {version} does not match the database's check "
                                         "value")
    with _lock:
        _keys[version] = key
    return key


def _newest() -> int | None:
    return KekVersion.objects.order_by("-version").values_list("version", flat=True).first()


def active_version() -> int:
    """The newest KEK version; the first is created on first use (embedded installs need no set-up)."""
    newest = _newest()
    return newest if newest is not None else create_version(first=True)


def _lock_versions() -> None:
    """Serialise minting across processes and hosts until the transaction ends. Locking the newest row would
    lock nothing while the table is empty, and every process's first secret would mint a version of its own."""
    if connection.vendor == "postgresql":  # SQLite's transactions begin IMMEDIATE: they hold its write lock already
        with connection.cursor() as cursor:  # conflicts with itself and with inserts, not with reads
            cursor.execute(f"LOCK TABLE {KekVersion._meta.db_table} IN SHARE ROW EXCLUSIVE MODE")


def create_version(first: bool = False) -> int:
    """Mint the next KEK version: a new key file, then its row (a crash between them leaves an orphan file,
    which the next attempt refuses to overwrite). ``first``: only if there is none yet (first use), else the
    version another process minted meanwhile."""
    with transaction.atomic():
        _lock_versions()
        newest = _newest()
        if first and newest is not None:
            return newest
        version = (newest or 0) + 1
        key = _random.token_bytes(KEY_BYTES)
        _write_key(version, key)
        KekVersion.objects.create(version=version, kcv=check_value(key))
    with _lock:
        _keys[version] = key
    return version


def problems() -> list[str]:
    """Why the keys cannot be trusted (the boot check): every registered version must resolve to a key file
    whose check value matches."""
    out = []
    for version in KekVersion.objects.filter(retired_at__isnull=True).values_list("version", flat=True):
        try:
            _load(version)
        except SecretError as exc:
            out.append(f"{exc.failure_class}: {exc}")
    return out


UNREADABLE = 0  # the key under which versions_in_use counts blobs that are not sealed secrets at all


def versions_in_use() -> dict[int, int]:
    """KEK version → how many sealed values are wrapped under it, over every registered sealed column. Blobs
    whose header does not parse count under ``UNREADABLE`` (0, never a real version)."""
    counts: dict[int, int] = {}
    for col in SEALED:
        for blob in col.model._default_manager.exclude(**{f"{col.column}__isnull": True}).values_list(
                col.column, flat=True).iterator():
            if blob:
                try:
                    v = kek_version_of(blob)
                except SecretError:  # a damaged row: counted apart (UNREADABLE), never the reason a status fails
                    v = UNREADABLE
                counts[v] = counts.get(v, 0) + 1
    return counts


def retire_version(version: int) -> None:
    """Retire a KEK version no sealed value uses any more (after rotate + rewrap): mark it retired, then delete
    its key file. The active (newest) version is never retired; a version still in use is refused."""
    from django.utils import timezone  # deferred: keeps this module's import-time surface small

    with transaction.atomic():
        row = KekVersion.objects.select_for_update().filter(pk=version, retired_at__isnull=True).first()
        if row is None:
            raise SecretError("kek_unresolvable", f"KEK version {version} is not a live version")
        if version == KekVersion.objects.order_by("-version").values_list("version", flat=True).first():
            raise SecretError("kek_corrupt", f"KEK version {version} is the active version; rotate first")
        used = versions_in_use().get(version, 0)
        if used:
            raise SecretError("kek_corrupt", f"KEK version {version} is still used by {used} sealed value(s): run "
                                             "rewrap_secrets first")
        row.retired_at = timezone.now()
        row.save(update_fields=["retired_at"])
    with _lock:
        _keys.pop(version, None)
    _key_path(version).unlink(missing_ok=True)


def forget_keys() -> None:
    """Drop the in-process key cache (tests; a process re-reads the files on next use)."""
    with _lock:
        _keys.clear()


# --- sealing ---------------------------------------------------------------------------------------

def seal(plaintext: str | bytes, where: Where) -> bytes:
    data = plaintext.encode() if isinstance(plaintext, str) else plaintext
    version = active_version()
    kek = _load(version)
    dek = _random.token_bytes(KEY_BYTES)
    wrap_nonce, data_nonce = _random.token_bytes(NONCE_BYTES), _random.token_bytes(NONCE_BYTES)
    wrapped = AESGCM(kek).encrypt(wrap_nonce, dek, where.aad(version))
    sealed = AESGCM(dek).encrypt(data_nonce, data, where.aad())
    # AESGCM appends the 16-byte tag; the blob keeps each tag in front of what it protects.
    return (_HEADER.pack(BLOB_VERSION, version) + wrap_nonce + wrapped[:-TAG_BYTES] + wrapped[-TAG_BYTES:]
            + data_nonce + sealed[-TAG_BYTES:] + sealed[:-TAG_BYTES])


def _parts(blob: bytes) -> tuple[int, bytes, bytes, bytes, bytes]:
    if not isinstance(blob, (bytes, bytearray, memoryview)) or len(blob) < _DATA_START:
        raise SecretError("malformed_blob", "not a sealed secret")
    blob = bytes(blob)
    ver, version = _HEADER.unpack_from(blob)
    if ver != BLOB_VERSION:
        raise SecretError("malformed_blob", f"unknown sealed-secret format {ver}")
    p = _HEADER.size
    wrap_nonce, wrapped, wrap_tag = blob[p:p + 12], blob[p + 12:p + 44], blob[p + 44:_WRAP_END]
    return version, wrap_nonce, wrapped + wrap_tag, blob[_WRAP_END:_WRAP_END + 12], blob[_WRAP_END + 12:]


def _dek(version: int, wrap_nonce: bytes, wrapped: bytes, where: Where) -> bytes:
    try:
        return AESGCM(_load(version)).decrypt(wrap_nonce, wrapped, where.aad(version))
    except InvalidTag:
        raise SecretError("tag_mismatch", f"the data key of {where.table}.{where.column} does not open here") from None


def unseal(blob: bytes, where: Where) -> bytes:
    """The secret, or SecretError with its class (counted in yuzu_server_secret_decrypt_failures_total and
    audited as ``secret.decrypt_failure`` with where the blob lives, never its content)."""
    try:
        return _unseal(blob, where)
    except SecretError as exc:
        from .audit import audit  # deferred: yuzu.audit imports the models this module's callers load first
        from .metrics import SECRET_DECRYPT_FAILURES  # deferred: as above

        SECRET_DECRYPT_FAILURES.labels(where.store, exc.failure_class).inc()
        audit(None, "secret.decrypt_failure", "failure", target_type=where.table, target_id=where.pk,
              detail=f"store={where.store} column={where.column} failure_class={exc.failure_class}")
        raise


def _unseal(blob: bytes, where: Where) -> bytes:
    version, wrap_nonce, wrapped, data_nonce, rest = _parts(blob)
    dek = _dek(version, wrap_nonce, wrapped, where)
    tag, ciphertext = rest[:TAG_BYTES], rest[TAG_BYTES:]
    try:
        return AESGCM(dek).decrypt(data_nonce, ciphertext + tag, where.aad())
    except InvalidTag:
        raise SecretError("tag_mismatch", f"the value of {where.table}.{where.column} does not open here") from None


def kek_version_of(blob: bytes) -> int:
    return _parts(blob)[0]


def rewrap(blob: bytes, where: Where, version: int | None = None) -> bytes:
    """The same secret under KEK ``version`` (default: the active one): only the DEK's wrap changes."""
    old, wrap_nonce, wrapped, data_nonce, rest = _parts(blob)
    version = version or active_version()
    if old == version:
        return bytes(blob)
    dek = _dek(old, wrap_nonce, wrapped, where)
    nonce = _random.token_bytes(NONCE_BYTES)
    new = AESGCM(_load(version)).encrypt(nonce, dek, where.aad(version))
    return _HEADER.pack(BLOB_VERSION, version) + nonce + new[:-TAG_BYTES] + new[-TAG_BYTES:] + data_nonce + rest


# --- the registry of sealed columns ------------------------------------------------------------------

@dataclass(frozen=True)
class SealedColumn:
    store: str
    model: type[models.Model]
    column: str

    def where(self, pk: str | int) -> Where:
        return Where(self.store, self.model._meta.db_table, self.column, pk)


SEALED: list[SealedColumn] = []


def sealed_column(store: str, model: type[models.Model], column: str) -> SealedColumn:
    """Declare a model column that holds sealed blobs (a BinaryField): a KEK rotation re-wraps it."""
    col = SealedColumn(store, model, column)
    if col not in SEALED:
        SEALED.append(col)
    return col


def rewrap_all(version: int | None = None) -> int:
    """Re-wrap every registered sealed value still on an older KEK version, each row with a compare-and-swap
    (``UPDATE … WHERE column = <old blob>``) so a concurrent write wins. Returns how many rows moved."""
    version = version or active_version()
    moved = 0
    for col in SEALED:
        rows = col.model._default_manager.exclude(**{f"{col.column}__isnull": True}).values_list("pk", col.column)
        for pk, blob in rows.iterator():
            try:
                if blob is None or kek_version_of(blob) == version:
                    continue
            except SecretError:  # not a sealed secret: no KEK opens it, so no rewrap moves it (get_kek_status counts it)
                continue
            new = rewrap(blob, col.where(pk), version)
            moved += col.model._default_manager.filter(pk=pk, **{col.column: bytes(blob)}).update(**{col.column: new})
    return moved


#: the admins' authenticator seeds (yuzu.models.TOTPDevice)
AUTHENTICATOR_SEED = sealed_column("yuzu", TOTPDevice, "key_sealed")
