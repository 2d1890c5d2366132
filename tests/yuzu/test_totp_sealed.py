"""Authenticator seeds are sealed at rest (yuzu.models.TOTPDevice, yuzu.secrets): the database holds no form of an
approver's seed, a seed's blob opens only in its own row, a KEK rotation re-wraps it, and django-otp's TOTP rules
(a code accepted once, drift tolerance, throttling) hold on the sealed device. Migration yuzu 0005 seals the devices
django-otp stored in clear and leaves no copy behind."""

import importlib
import time
from base64 import b32encode
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.db import connection
from django.test import Client
from django_otp import device_classes, devices_for_user, match_token
from django_otp.oath import TOTP

from tests.support.otp import code
from tests.support.races import at_once
from yuzu import secrets
from yuzu.models import AuditEvent, TOTPDevice

pytestmark = pytest.mark.django_db

PASSWORD = "pw-long-enough-1"
MIGRATION = importlib.import_module("yuzu.migrations.0005_totp_sealed")


def spellings(seed):
    """Every form a seed could be stored in: raw bytes, hex (django-otp's column), base32 (the otpauth URI)."""
    b32 = b32encode(seed)
    return [seed, seed.hex().encode(), seed.hex().upper().encode(), b32, b32.rstrip(b"=")]


def row_bytes(table, pk):
    """The row as the database holds it, every column as bytes (what a dump, a replica or a SQL hole reads)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)} WHERE id = %s", [pk])
        row = cursor.fetchone()
    return [bytes(v) if isinstance(v, (bytes, memoryview)) else str(v).encode() for v in row]


def code_for(seed, t):
    """The code of time step ``t`` (django-otp's defaults: 30 s steps, 6 digits)."""
    totp = TOTP(seed, 30, 0, 6)
    totp.time = 30 * t
    return f"{totp.token():06d}"


def now_t():
    return int(time.time()) // 30


def test_a_new_devices_row_holds_no_form_of_its_seed(make_user):
    device = TOTPDevice.objects.create(user=make_user("alice"), name="phone", confirmed=True)
    seed = TOTPDevice.objects.get(pk=device.pk).bin_key
    assert len(seed) == TOTPDevice.SEED_BYTES
    row = row_bytes("yuzu_totpdevice", device.pk)
    assert not any(s in column for s in spellings(seed) for column in row)
    assert secrets.kek_version_of(bytes(TOTPDevice.objects.get(pk=device.pk).key_sealed)) == secrets.active_version()
    # a reset draws a new seed, sealed too; the old one no longer verifies
    device.reset()
    device.save()
    fresh = TOTPDevice.objects.get(pk=device.pk)
    assert fresh.bin_key != seed and not fresh.confirmed
    assert not any(s in column for s in spellings(fresh.bin_key) for column in row_bytes("yuzu_totpdevice", device.pk))
    assert not fresh.verify_token(code_for(seed, now_t()))
    fresh.throttle_reset()
    assert fresh.verify_token(code(fresh))
    # django-otp's plaintext table is gone, and django-otp discovers one TOTP device class: each device once
    assert "otp_totp_totpdevice" not in connection.introspection.table_names()
    assert list(device_classes()) == [TOTPDevice]
    assert list(devices_for_user(device.user, confirmed=None)) == [fresh]


def test_a_seed_blob_copied_to_another_row_does_not_verify(make_user):
    """Whoever can write the database (not read the KEK) copies their own device's blob over an approver's, then
    signs in as the approver with their own codes: refused, without a 500, and audited."""
    mallory = TOTPDevice.objects.create(user=make_user("mallory"), name="phone", confirmed=True)
    alice = make_user("alice", password=PASSWORD)
    alice.is_staff = True
    alice.save()
    victim = TOTPDevice.objects.create(user=alice, name="phone", confirmed=True)
    TOTPDevice.objects.filter(pk=victim.pk).update(key_sealed=bytes(mallory.key_sealed))
    victim.refresh_from_db()
    with pytest.raises(secrets.SecretError) as err:
        victim.bin_key  # noqa: B018
    assert err.value.failure_class == "tag_mismatch"
    r = Client(raise_request_exception=False).post("/admin/login/?next=/admin/", {
        "username": "alice", "password": PASSWORD, "otp_token": code(mallory)})
    assert r.status_code == 200 and "_auth_user_id" not in r.client.session
    assert match_token(alice, code(mallory)) is None
    assert not victim.verify_token(code(mallory))
    assert AuditEvent.objects.filter(action="secret.decrypt_failure", target_id=str(victim.pk)).exists()
    # the blob still opens where it belongs
    assert mallory.verify_token(code(mallory))
    # set up at /admin/enrol/, a copied blob shows nothing (no 500, no one else's secret) until a reset
    TOTPDevice.objects.filter(pk=victim.pk).update(confirmed=False)
    c = Client(raise_request_exception=False)
    assert c.post("/admin/enrol/", {"username": "alice", "password": PASSWORD}).status_code == 302
    page = c.get("/admin/enrol/")
    assert page.status_code == 200 and "cannot be opened on this server" in page.content.decode()
    assert not any(s.decode() in page.content.decode() for s in spellings(mallory.bin_key)[1:])
    victim.refresh_from_db()
    victim.reset()
    victim.save()
    assert "otpauth://" in c.get("/admin/enrol/").content.decode()


def test_rewrap_after_a_kek_rotation_rewraps_the_seed_and_codes_still_verify(make_user):
    device = TOTPDevice.objects.create(user=make_user("alice"), name="phone", confirmed=True)
    old = secrets.kek_version_of(bytes(TOTPDevice.objects.get(pk=device.pk).key_sealed))
    new = secrets.create_version()
    assert secrets.versions_in_use().get(old, 0) >= 1
    assert secrets.rewrap_all(new) >= 1
    device.refresh_from_db()
    assert secrets.kek_version_of(bytes(device.key_sealed)) == new
    secrets.retire_version(old)  # nothing uses the old key any more: its file goes
    secrets.forget_keys()
    assert device.verify_token(code(device))


def test_a_code_is_accepted_once_within_the_drift_tolerance_and_wrong_codes_are_throttled(make_user, settings):
    settings.OTP_TOTP_THROTTLE_FACTOR = 60  # a minute's wait after one wrong code: no race with the clock
    device = TOTPDevice.objects.create(user=make_user("alice"), name="phone", confirmed=True)
    seed, t = device.bin_key, now_t()
    assert not device.verify_token(code_for(seed, t - 3))  # outside the tolerance
    assert device.throttling_failure_count == 1 and not device.verify_is_allowed()[0]
    assert not device.verify_token(code_for(seed, t))  # the right code, but throttled
    device.throttle_reset()
    assert device.verify_token(code_for(seed, t - 1))  # one step late: accepted, the drift learned
    device.refresh_from_db()
    assert (device.drift, device.last_t, device.throttling_failure_count) == (-1, t - 1, 0)
    assert device.last_used_at is not None
    assert not device.verify_token(code_for(seed, t - 1))  # replayed: refused
    assert device.was_used(code_for(seed, t - 1)) and not device.was_used(code_for(seed, t))
    device.throttle_reset()
    assert device.verify_token(code_for(seed, t))  # the next step's code is fine


def legacy_table(rows):
    """django-otp's otp_totp_totpdevice as an install before yuzu 0005 has it, with ``rows`` in it."""
    ts = "TIMESTAMP WITH TIME ZONE" if connection.vendor == "postgresql" else "datetime"
    with connection.cursor() as cursor:
        cursor.execute(f"""CREATE TABLE otp_totp_totpdevice (
            id integer PRIMARY KEY, user_id integer NOT NULL, name varchar(64) NOT NULL, confirmed boolean NOT NULL,
            {connection.ops.quote_name("key")} varchar(80) NOT NULL, step smallint NOT NULL, t0 bigint NOT NULL,
            digits smallint NOT NULL, tolerance smallint NOT NULL, drift smallint NOT NULL, last_t bigint NOT NULL,
            throttling_failure_timestamp {ts} NULL, throttling_failure_count integer NOT NULL,
            created_at {ts} NULL, last_used_at {ts} NULL)""")
        for row in rows:
            cursor.execute("INSERT INTO otp_totp_totpdevice (id, user_id, name, confirmed, "
                           f"{connection.ops.quote_name('key')}, step, t0, digits, tolerance, drift, last_t, "
                           "throttling_failure_count, created_at) "
                           "VALUES (%s, %s, %s, %s, %s, 30, 0, 6, 1, 0, %s, %s, %s)", row)
        cursor.execute("INSERT INTO django_migrations (app, name, applied) VALUES ('otp_totp', '0001_initial', %s)",
                       ["2026-01-01 00:00:00+00:00"])


def test_the_migration_seals_the_devices_django_otp_stored_in_clear(make_user):
    alice, bob = make_user("alice"), make_user("bob")
    seed, pending = bytes(range(1, 21)), bytes(range(21, 41))
    used_t = now_t()
    legacy_table([(7, alice.pk, "alice's phone", True, seed.hex(), used_t, 0, "2025-06-01 10:00:00+00:00"),
                  (8, bob.pk, "new", False, pending.hex(), -1, 2, None)])
    MIGRATION.seal_legacy_devices(apps, SimpleNamespace(connection=connection))

    assert "otp_totp_totpdevice" not in connection.introspection.table_names()
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM django_migrations WHERE app = 'otp_totp'")
        assert cursor.fetchone()[0] == 0
    a, b = TOTPDevice.objects.get(user=alice), TOTPDevice.objects.get(user=bob)
    assert (a.name, a.confirmed, a.last_t, a.created_at.year) == ("alice's phone", True, used_t, 2025)
    assert (b.name, b.confirmed, b.throttling_failure_count) == ("new", False, 2)
    for device, s in ((a, seed), (b, pending)):
        assert device.bin_key == s
        assert not any(x in column for x in spellings(s) for column in row_bytes("yuzu_totpdevice", device.pk))
    assert not a.verify_token(code_for(seed, used_t))  # used before the upgrade: still refused
    a.throttle_reset()
    assert a.verify_token(code_for(seed, used_t + 1))  # the next one signs alice in
    # and an install that never had django-otp's table migrates without it
    MIGRATION.seal_legacy_devices(apps, SimpleNamespace(connection=connection))
    assert TOTPDevice.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_one_code_verified_from_several_places_at_once_is_accepted_once(make_user):
    """The same fresh code sent at the same instant (two approvals, or an approval and a sign-in, by someone who
    saw it): the device's row lock makes the verifications take turns, so the second finds the first's ``last_t``
    and refuses it, as it would in sequence."""
    device = TOTPDevice.objects.create(user=make_user("alice"), name="phone", confirmed=True)
    seed = TOTPDevice.objects.get(pk=device.pk).bin_key
    for _ in range(10):
        token = code_for(seed, now_t())
        TOTPDevice.objects.filter(pk=device.pk).update(last_t=now_t() - 2, throttling_failure_count=0,
                                                       throttling_failure_timestamp=None)
        outcomes = at_once(*[lambda t=token: TOTPDevice.objects.get(pk=device.pk).verify_token(t)] * 3)
        assert sorted(out for _, out in outcomes) == [False, False, True], outcomes
