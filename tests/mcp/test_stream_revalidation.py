"""Held-open streams re-check their credentials together (mcp.streaming.watch): one hop and one query per tick
for every stream of the process, more only when a token, user or role changed."""

import asyncio

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from mcp.streaming import watch
from mcp.streaming.sessions import store
from yuzu.auth import principal_for_token
from yuzu.models import ApiToken
from yuzu.rbac import Principal

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def streams(mint):
    out = []
    for i in range(30):
        p = principal_for_token(mint(f"user{i}", tier="operator"))
        out.append((p, store().create(p.key, "v1", "2025-11-25", "t", "0").id))
    yield out
    store().clear()


def test_one_query_per_tick_for_every_stream(streams, django_assert_num_queries):
    watch.revalidate_all(streams)  # the credentials are read once
    with django_assert_num_queries(1):  # then only the auth version
        assert watch.revalidate_all(streams) == ["ok"] * 30
    ApiToken.objects.filter(owner__username="user7").update(revoked_at=timezone.now())
    with django_assert_num_queries(2):  # the version moved: the batch's tokens, in one query
        verdicts = watch.revalidate_all(streams)
    assert verdicts[7] == "credential_revoked" and verdicts.count("ok") == 29
    get_user_model().objects.filter(username="user3").update(is_active=False)
    store().delete(streams[5][1], streams[5][0].key, by_client=True)
    verdicts = watch.revalidate_all(streams)
    assert (verdicts[3], verdicts[5], verdicts[7]) == ("credential_revoked", "session_deleted", "credential_revoked")


def test_expiry_is_noticed_without_a_change(streams):
    p, sid = streams[0]
    assert watch.revalidate_all([(p, sid)]) == ["ok"]
    p.token.expires_at = timezone.now()  # as if the clock passed it
    assert watch.revalidate_all([(p, sid)]) == ["credential_revoked"]


def test_an_admin_session_principal_is_checked_by_its_user(make_user):
    p = Principal(user=make_user("root", superuser=True), via="session")
    sid = store().create(p.key, "v1", "2025-11-25", "t", "0").id
    assert watch.revalidate_all([(p, sid)]) == ["ok"]
    get_user_model().objects.filter(username="root").update(is_active=False)
    assert watch.revalidate_all([(p, sid)]) == ["credential_revoked"]


@pytest.mark.parametrize("ended_by", ["logout", "staff_removed", "password_changed", "authenticator_removed"])
def test_an_admin_session_principal_is_cut_off_with_its_admin_session(make_user, ended_by):
    """A stream opened with the admin session cookie lives as long as that admin session would still authenticate:
    signing out, losing staff, a password change or the authenticator removed end it within a tick, as a revoked
    token does — not only the user's deactivation."""
    from tests.support.oauth_flow import signed_in
    from yuzu.auth import principal_for_session
    from yuzu.models import TOTPDevice

    user = make_user("root", superuser=True)
    browser = signed_in(user)
    p = principal_for_session(browser.session.session_key)
    assert p is not None
    sid = store().create(p.key, "v1", "2025-11-25", "t", "0").id
    assert watch.revalidate_all([(p, sid)]) == ["ok"]
    if ended_by == "logout":
        browser.logout()
    elif ended_by == "staff_removed":
        get_user_model().objects.filter(pk=user.pk).update(is_staff=False)
    elif ended_by == "password_changed":
        user.set_password("a-new-one-entirely")
        user.save()
    else:
        TOTPDevice.objects.filter(user=user).delete()
    assert watch.revalidate_all([(p, sid)]) == ["credential_revoked"]


async def until(predicate):
    while not predicate():
        await asyncio.sleep(0.01)


def test_one_pass_per_tick_checks_every_stream(streams, monkeypatch):
    monkeypatch.setattr(watch, "TICK_SECONDS", 0.05)
    passes = []
    real = watch.revalidate_all
    monkeypatch.setattr(watch, "revalidate_all", lambda checks: passes.append(len(checks)) or real(checks))

    async def go():
        watches = [watch.CredentialWatch(p, sid) for p, sid in streams]
        assert [await w.check() for w in watches] == [None] * 30  # admitted: ok until a pass says otherwise
        await asyncio.sleep(0.3)
        assert set(passes) == {30}, passes  # each pass: every stream in one hop
        await asyncio.to_thread(lambda: ApiToken.objects.filter(owner__username="user4").update(
            revoked_at=timezone.now()))
        await asyncio.sleep(0.3)
        assert await watches[4].check() == "credential_revoked" and await watches[5].check() is None
        for w in watches[:10]:
            w.stop()
        # A pass already handed to its thread when they stopped still counts them; passes run one after
        # another, so once one has counted 20, none that counts 30 is left.
        await asyncio.wait_for(until(lambda: 20 in passes), 5)
        passes.clear()
        await asyncio.sleep(0.3)
        assert passes and set(passes) == {20}, passes

    asyncio.run(go())
