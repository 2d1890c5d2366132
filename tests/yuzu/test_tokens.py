"""API tokens: hashing, expiry, revocation, the 90-day MCP cap and rotation with overlap."""

from datetime import timedelta
from functools import partial

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from tests.support.races import at_once
from yuzu import tokens
from yuzu.auth import AuthError, principal_for_token
from yuzu.models import ApiToken, hash_secret
from yuzu.rbac import Principal

pytestmark = pytest.mark.django_db


def test_token_is_shown_once_and_stored_hashed(make_user):
    user = make_user("alice", "Viewer")
    token, raw = ApiToken.mint(user, "laptop")
    assert raw.startswith("yuzu_") and len(raw) == 69 and all(c in "0123456789abcdef" for c in raw[5:])
    row = ApiToken.objects.get(pk=token.pk)
    assert row.token_hash == hash_secret(raw) and raw not in (row.token_hash, row.prefix, row.name)
    assert not ApiToken.objects.filter(token_hash=raw).exists()
    assert principal_for_token(raw).user == user


def test_expired_and_revoked_tokens_fail(make_user):
    user = make_user("alice", "Viewer")
    now = timezone.now()
    t, raw = ApiToken.mint(user, "short", expires_at=now + timedelta(minutes=1), now=now)
    assert principal_for_token(raw, now=now).user == user
    with pytest.raises(AuthError):
        principal_for_token(raw, now=now + timedelta(minutes=2))
    t.revoked_at = now
    t.save()
    with pytest.raises(AuthError):
        principal_for_token(raw, now=now)


def test_inactive_owner_and_malformed_tokens_fail(make_user):
    user = make_user("alice", "Viewer")
    _, raw = ApiToken.mint(user, "x")
    user.is_active = False
    user.save()
    with pytest.raises(AuthError):
        principal_for_token(raw)
    for bad in ("", "yuzu_", "yuzu_" + "g" * 64, raw + "0", "bearer"):
        with pytest.raises(AuthError):
            principal_for_token(bad)


def test_mcp_token_must_expire_within_90_days(make_user):
    user = make_user("alice", "Viewer")
    now = timezone.now()
    with pytest.raises(ValidationError):
        ApiToken.mint(user, "forever", mcp_tier="operator", now=now)
    with pytest.raises(ValidationError):
        ApiToken.mint(user, "long", mcp_tier="operator", expires_at=now + timedelta(days=91), now=now)
    with pytest.raises(ValidationError):
        ApiToken.mint(user, "bad tier", mcp_tier="root", expires_at=now + timedelta(days=1), now=now)
    t, _ = ApiToken.mint(user, "ok", mcp_tier="readonly", expires_at=now + timedelta(days=90), now=now)
    assert t.mcp_tier == "readonly"
    # A non-MCP token may live forever.
    assert ApiToken.mint(user, "cli")[0].expires_at is None


def test_rotation_overlap_then_confirm(make_user):
    user = make_user("alice", "Operator")
    old, old_raw = ApiToken.mint(user, "ci", mcp_tier="operator", expires_at=timezone.now() + timedelta(days=10))
    p = Principal(user=user, token=old)
    out = tokens.rotate_token(p, old.id, overlap_secs=3600)
    new = ApiToken.objects.get(pk=out["id"])
    assert new.expires_at == old.expires_at and new.mcp_tier == "operator" and new.rotated_from_id == old.id
    # Both work during the overlap…
    assert principal_for_token(old_raw).token.pk == old.pk
    assert principal_for_token(out["token"]).token.pk == new.pk
    # …the old one stops after it…
    with pytest.raises(AuthError):
        principal_for_token(old_raw, now=timezone.now() + timedelta(seconds=3601))
    # …or at once on confirm.
    tokens.confirm_rotation(p, new.id)
    with pytest.raises(AuthError):
        principal_for_token(old_raw)
    assert principal_for_token(out["token"]).token.pk == new.pk


def test_rotation_refuses_twice_and_foreign_tokens(make_user):
    from yuzu.errors import NotFound, YuzuError

    alice, bob = make_user("alice", "Operator"), make_user("bob", "Operator")
    t, _ = ApiToken.mint(alice, "x")
    tokens.rotate_token(Principal(user=alice), t.id)
    with pytest.raises(YuzuError):
        tokens.rotate_token(Principal(user=alice), t.id)
    with pytest.raises(NotFound):
        tokens.rotate_token(Principal(user=bob), t.id)
    with pytest.raises(NotFound):
        tokens.revoke_token(Principal(user=bob), t.id)
    with pytest.raises(ValidationError):
        tokens.rotate_token(Principal(user=alice), t.id, overlap_secs=-1)


# --- issue 10 item 1: a tiered token never obtains a token above itself ---------------------------

def _tiered(user, tier, days):
    return ApiToken.mint(user, f"{tier}-{days}", mcp_tier=tier, expires_at=timezone.now() + timedelta(days=days))


@pytest.mark.django_db(transaction=True)
def test_rotations_of_one_token_at_once_leave_one_successor(make_user):
    """Three rotations released together: the token's row lock makes them take turns, so the first mints the
    successor and the others find it and are refused — never two live successors of one token."""
    alice = make_user("alice", "Operator")
    for _ in range(5):
        t, _ = ApiToken.mint(alice, "x", expires_at=timezone.now() + timedelta(days=3))
        outcomes = at_once(*[partial(tokens.rotate_token, Principal(user=alice), t.id)] * 3)
        assert sorted(kind for kind, _ in outcomes) == ["error", "error", "ok"], outcomes
        assert all("already has a successor" in str(e) for kind, e in outcomes if kind == "error"), outcomes
        assert ApiToken.objects.filter(rotated_from=t).count() == 1


def test_operator_token_cannot_rotate_its_owners_untiered_token(make_user):
    from yuzu.errors import PermissionDenied

    user = make_user("alice", "Operator")
    untiered, _ = ApiToken.mint(user, "cli")  # no tier, no expiry
    higher, _ = _tiered(user, "supervised", 10)
    longer, _ = _tiered(user, "operator", 60)
    caller, _ = _tiered(user, "operator", 30)
    p = Principal(user=user, token=caller)
    for target in (untiered, higher, longer):
        with pytest.raises(PermissionDenied) as exc:
            tokens.rotate_token(p, target.id)
        assert "operator-tier token may only obtain tokens of tier operator or lower" in exc.value.message
    assert not ApiToken.objects.filter(rotated_from__in=[untiered, higher, longer]).exists()
    # One that outlives the caller by seconds says so: both times to the second (a probe read "23:49 … 23:49").
    seconds_later, _ = ApiToken.mint(user, "later", mcp_tier="operator", expires_at=caller.expires_at + timedelta(seconds=5))
    with pytest.raises(PermissionDenied) as exc:
        tokens.rotate_token(p, seconds_later.id)
    assert f"expire by {caller.expires_at:%Y-%m-%d %H:%M:%S} UTC" in exc.value.message
    assert f"expiring {seconds_later.expires_at:%Y-%m-%d %H:%M:%S} UTC" in exc.value.message
    # Itself, and a lower tier that expires sooner, are fine.
    lower, _ = _tiered(user, "readonly", 5)
    assert ApiToken.objects.get(pk=tokens.rotate_token(p, lower.id)["id"]).mcp_tier == "readonly"
    assert ApiToken.objects.get(pk=tokens.rotate_token(p, caller.id)["id"]).mcp_tier == "operator"


def test_tiered_confirm_and_create_obey_the_same_ceiling(make_user):
    from yuzu.errors import PermissionDenied

    user = make_user("alice", "Administrator")
    untiered, _ = ApiToken.mint(user, "cli")
    successor = tokens.rotate_token(Principal(user=user), untiered.id)  # an untiered caller may
    caller, _ = _tiered(user, "supervised", 30)
    p = Principal(user=user, token=caller)
    with pytest.raises(PermissionDenied):
        tokens.confirm_rotation(p, successor["id"])
    assert ApiToken.objects.get(pk=untiered.pk).revoked_at is None
    for kwargs in ({}, {"mcp_tier": "supervised"}, {"mcp_tier": "operator",
                                                    "expires_at": (timezone.now() + timedelta(days=45)).isoformat()}):
        with pytest.raises(PermissionDenied):
            tokens.create_token(p, name="escalate", **kwargs)
    ok = tokens.create_token(p, name="fine", mcp_tier="readonly",
                             expires_at=(timezone.now() + timedelta(days=7)).isoformat())
    assert ok["mcp_tier"] == "readonly"


def test_session_caller_needs_fresh_mfa_to_rotate_or_confirm(make_user):
    import time

    from yuzu.errors import PermissionDenied

    user = make_user("alice", "Operator")
    t, _ = ApiToken.mint(user, "cli")
    with pytest.raises(PermissionDenied) as exc:
        tokens.rotate_token(Principal(user=user, via="session"), t.id)
    assert "mfa_proof_missing" in exc.value.message
    out = tokens.rotate_token(Principal(user=user, via="session", mfa_verified_at=time.time()), t.id)
    with pytest.raises(PermissionDenied):
        tokens.confirm_rotation(Principal(user=user, via="session", mfa_verified_at=time.time() - 3600), out["id"])


def test_rest_rotate_with_an_operator_token_cannot_escalate(client, make_user):
    user = make_user("alice", "Operator")
    untiered, _ = ApiToken.mint(user, "cli")
    _, raw = _tiered(user, "operator", 30)
    r = client.post(f"/api/v1/tokens/{untiered.id}/rotate", data={}, content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert r.status_code == 403, r.content
    assert r.json()["error"]["permission"] == "ApiToken:Rotate"
    assert not ApiToken.objects.filter(rotated_from=untiered).exists()
