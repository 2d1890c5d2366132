"""The KEK tools (spec/governance.md §4) and secrets at rest across the stores: no plaintext secret in a
database dump; after rotate_kek + rewrap_secrets every secret opens under the new version and the old one can
be retired."""

import io

import pytest
from django.core.management import call_command
from django.test import Client

from governance import kek
from governance.models import ROTATION_SECRET, EngineRotation
from pki import ca
from yuzu import secrets
from yuzu.errors import YuzuError
from yuzu.models import KekVersion
from yuzu.rbac import Principal

pytestmark = pytest.mark.django_db


def dump():
    out = io.StringIO()
    call_command("dumpdata", stdout=out)
    return out.getvalue()


def test_rotate_rewrap_status_and_retire(make_user, settings, mint):
    settings.YUZU_KEK_MIN_ROTATE_INTERVAL = 0
    root = Principal(user=make_user("root", "Administrator"))
    ca.authority()  # the CA key: sealed under v1
    assert kek.get_kek_status(root)["active_version"] == 1
    status = kek.get_kek_status(root)
    assert status["oldest_in_use"] == 1 and status["rotation_complete"] is True and status["lock_held"] is False
    out = kek.rotate_kek(root)
    assert out == {"new_version": 2, "rotation_complete": True}
    assert kek.get_kek_status(root)["oldest_in_use"] == 2
    assert kek.rewrap_secrets(root) == {"rows_rewrapped": 0}  # nothing behind: a normal outcome
    # the old version can be retired: nothing uses it, its key file goes, everything still opens
    secrets.retire_version(1)
    assert KekVersion.objects.get(pk=1).retired_at is not None
    assert not (settings.YUZU_KEK_DIR / "secrets-kek-v1.key").exists()
    secrets.forget_keys()
    assert secrets.problems() == []
    assert ca._ca_key(ca.authority()) is not None  # the CA key opens under v2 alone


def test_a_damaged_row_is_counted_not_fatal(make_user, settings):
    """A stored value that is not a sealed secret at all (a damaged row, a bad restore) must not take the KEK
    tools down with it: the status counts it apart, a rewrap moves the rest and skips it, rotation completes."""
    from operations.models import PluginSecret

    settings.YUZU_KEK_MIN_ROTATE_INTERVAL = 0
    root = Principal(user=make_user("root", "Administrator"))
    ca.authority()
    PluginSecret.objects.create(scope_key="p.k", plugin="p", key="k", sealed_value=b"not a blob", updated_by="x")
    status = kek.get_kek_status(root)
    assert status["unreadable_secrets"] == 1 and status["oldest_in_use"] == 1 and status["live_versions"] == 1
    assert kek.rotate_kek(root) == {"new_version": 2, "rotation_complete": True}
    assert kek.rewrap_secrets(root) == {"rows_rewrapped": 0}
    assert kek.get_kek_status(root)["unreadable_secrets"] == 1


def test_cooldown_and_ceiling(make_user, settings):
    root = Principal(user=make_user("root", "Administrator"))
    secrets.active_version()
    with pytest.raises(YuzuError) as exc:
        kek.rotate_kek(root)
    assert exc.value.extra["failure"] == "cooldown" and exc.value.retry_after_ms > 3_000_000
    settings.YUZU_KEK_MIN_ROTATE_INTERVAL = 0
    settings.YUZU_KEK_MAX_LIVE_VERSIONS = 2
    kek.rotate_kek(root)
    with pytest.raises(YuzuError) as exc:
        kek.rotate_kek(root)
    assert exc.value.extra["failure"] == "version_ceiling" and exc.value.retry_after_ms is None


def test_retiring_a_version_still_in_use_is_refused(make_user):
    ca.authority()
    secrets.create_version()
    with pytest.raises(secrets.SecretError, match="still"):
        secrets.retire_version(1)


@pytest.mark.django_db(transaction=True)
def test_a_database_dump_holds_no_plaintext_secret(mint, make_user, settings):
    """Every stored secret — the CA key, an in-flight engine rotation's successor secret, a bridge profile's
    environment — is sealed: a dump of the database shows none of them."""
    from bridge.models import Profile
    from governance import engines
    from yuzu.plans import Plan

    settings.YUZU_KEK_MIN_ROTATE_INTERVAL = 0
    root = Principal(user=make_user("root", "Administrator"))
    make_user("owen")
    authority = ca.authority()
    engines.create_engine_principal(root, plan=Plan("", {"principal_id": "engine:bot", "display_name": "b",
                                                         "owner_username": "owen", "justification": "j",
                                                         "classification": "internal"}))
    engines.mint_engine_credential(root, plan=Plan("", ("engine:bot", "c", 30)))
    succ = engines.rotate_engine_credential(root, plan=Plan("", ("engine:bot", 7)))
    Profile.objects.create(name="sealed-profile", argv=["true"], env={"API_KEY": "sk-very-secret-value-123"})
    text = dump()
    from cryptography.hazmat.primitives import serialization

    key_der = ca._ca_key(authority).private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption())
    for plaintext in [succ["raw_token"], "sk-very-secret-value-123", "PRIVATE KEY", key_der.hex()[-64:]]:
        assert plaintext not in text, plaintext[:12]
    assert Profile.objects.get(name="sealed-profile").env == {"API_KEY": "sk-very-secret-value-123"}
    kek.rotate_kek(root)
    rot = EngineRotation.objects.get()
    assert secrets.kek_version_of(rot.secret_sealed) == 2
    assert secrets.unseal(rot.secret_sealed, ROTATION_SECRET.where(rot.pk)).decode() == succ["raw_token"]
    assert Profile.objects.get(name="sealed-profile").env == {"API_KEY": "sk-very-secret-value-123"}


def test_rest_kek_routes(mint):
    raw = mint("root", role="Administrator")
    c = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert c.get("/api/v1/secrets/kek/status").status_code == 200
    assert c.post("/api/v1/secrets/kek/rewrap", {}, content_type="application/json").json()["data"] == {
        "rows_rewrapped": 0}
    assert c.post("/api/v1/secrets/kek/rotate", {"x": 1}, content_type="application/json").status_code == 400
