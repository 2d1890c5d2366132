"""A primary connected through OAuth (docs/oauth.md) is one principal for the life of its connection: each refresh
replaces its access token's secret in the same row, so its bridge world (keyed by that row) carries on. Its access
token lapses every hour unless refreshed — and a client blocked in a long bridge_send, or idle while a detached
worker works, refreshes only when it next calls. That lapse is not a revocation: the poller must not stop its
workers for it. A connection that can no longer be refreshed (revoked, its consent over) is."""

from datetime import timedelta

import pytest
from django.utils import timezone

from bridge.models import Member
from bridge.workers import stop_orphans
from oauth.models import Authorization
from tests.support.mcp_http import McpClient
from tests.support.oauth_flow import BRIDGE, connect, refresh, signed_in
from yuzu.models import ApiToken, AuditEvent
from yuzu.rbac import Principal

pytestmark = pytest.mark.django_db(transaction=True)
SOCKET = "yuzu-test-oauth-primary"


@pytest.fixture
def connection(make_user):
    user = make_user("alice", "Operator", password="alice-password-1")
    user.is_staff = True
    user.save()
    _, body = connect(signed_in(user), resource=BRIDGE)
    auth = Authorization.objects.get()
    return auth, body


def worker_of(token):
    return Member.objects.create(owner=token.owner, owner_key=Principal.key_for(token.owner_id, token.pk),
                                 profile_name="standin", socket_name=SOCKET, name="w")


def lapse(token):
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))


def test_a_lapsed_access_token_keeps_its_workers_and_the_refresh_finds_them(connection):
    auth, body = connection
    m = worker_of(auth.api_token)
    lapse(auth.api_token)
    assert stop_orphans(SOCKET) == 0
    assert Member.objects.get(pk=m.pk).live, "an OAuth primary's workers were stopped when its access token lapsed"

    r = refresh(auth.application.client_id, body["refresh_token"])
    assert r.status_code == 200, r.content
    c = McpClient(r.json()["access_token"], path="/mcp/bridge/")
    c.initialize()
    listed = c.call("bridge_list").json()["result"]["structuredContent"]["workers"]
    assert [w["sessionId"] for w in listed] == [m.session_id]


def test_a_connection_that_cannot_be_refreshed_stops_its_workers(connection):
    auth, _ = connection
    m = worker_of(auth.api_token)
    lapse(auth.api_token)
    Authorization.objects.filter(pk=auth.pk).update(expires_at=timezone.now() - timedelta(seconds=1))  # consent over
    assert stop_orphans(SOCKET) == 1 and not Member.objects.get(pk=m.pk).live
    assert AuditEvent.objects.filter(action="bridge.stop", target_id=m.session_id,
                                     detail__contains="reason=primary_revoked").exists()

    again = worker_of(ApiToken.objects.get(pk=auth.api_token_id))
    Authorization.objects.get(pk=auth.pk).revoke("test")
    assert stop_orphans(SOCKET) == 1 and not Member.objects.get(pk=again.pk).live


def test_a_lapsed_plain_token_still_stops_its_workers(make_user):
    user = make_user("bob", "Operator")
    token, _ = ApiToken.mint(user, "primary", expires_at=timezone.now() + timedelta(hours=1))
    m = worker_of(token)
    lapse(token)
    assert stop_orphans(SOCKET) == 1 and not Member.objects.get(pk=m.pk).live


def test_a_locked_persons_oauth_primary_is_not_refreshable_and_its_workers_stop(connection):
    """A lapsed OAuth primary keeps its workers because its client may refresh — but not while an administrator's
    lock holds its person out (the refresh grant refuses it): its workers stop, as a deactivated person's do."""
    from yuzu.accounts import lock_account

    auth, _ = connection
    m = worker_of(auth.api_token)
    lapse(auth.api_token)
    root = Principal(user=type(auth.user).objects.create_superuser("root", "", "pw-root"), via="session")
    lock_account(root, "alice", timezone.now() + timedelta(minutes=30))
    assert stop_orphans(SOCKET) == 1 and not Member.objects.get(pk=m.pk).live
