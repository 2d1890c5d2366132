"""API tokens: hashing, expiry, revocation, the 90-day MCP cap and rotation with overlap."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from yuzu.auth import AuthError, principal_for_token
from yuzu.models import ApiToken, hash_secret
from yuzu.rbac import Principal
from yuzu import tokens

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
