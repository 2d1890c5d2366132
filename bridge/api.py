"""REST face of the bridge (parity with the tools; same services, tokens, guard and errors).

GET    /api/v1/bridge/members                    list (Bridge:Read)
POST   /api/v1/bridge/members       {profile}    spawn (Bridge:Execute); guard breach → 403 subscription_boundary
                                                 or isolation_boundary
DELETE /api/v1/bridge/members/{paneId}           stop (Bridge:Execute), idempotent
POST   /api/v1/bridge/members/{paneId}/events    hook sink: the worker's own token (audience "bridge") only

A primary may send ``X-Bridge-Pane: [<tmux socket>:]<pane>`` (as its pane knows it: ``$TMUX:$TMUX_PANE``) to say
where its own pane lives; the SubscriptionGuard then refuses to manage workers on that tmux server (docs/bridge.md).
"""

from rest_framework import authentication, exceptions
from rest_framework.decorators import api_view, authentication_classes

from mcp.schema import obj
from yuzu import rbac
from yuzu.api.contract import contract, items_of, payload, tool_input, tool_output
from yuzu.api.envelope import cid_of, ok
from yuzu.api.views import principal_of
from yuzu.auth import AuthError, authenticate
from yuzu.models import ApiToken

from . import reads, workers
from .failures import BridgeFailure
from .identity import identify


class WorkerTokenAuthentication(authentication.BaseAuthentication):
    """Only a bridge worker's token (audience "bridge") authenticates the hook sink."""

    def authenticate(self, request):
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            principal = authenticate(headers, None, audiences=(ApiToken.AUDIENCE_BRIDGE,))
        except AuthError as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
        if principal is None:
            return None
        return (principal.user, principal)  # request.auth is the principal (yuzu.api.views.principal_of)

    def authenticate_header(self, request):
        return 'Bearer realm="yuzu"'


def _primary(request, operation):
    principal = principal_of(request)
    rbac.check(principal, "Bridge", operation, any_scope=True)
    try:
        return identify(principal)
    except BridgeFailure as exc:
        raise exc.as_yuzu_error() from None


def _pane_hint(request):
    value = request.headers.get("X-Bridge-Pane", "").strip()
    return value[:200] or None


SPAWN = tool_input("bridge_spawn", "bridge")
HOOK = {"type": "object", "maxProperties": 64, "description": "The worker's lifecycle hook payload"}


@contract("GET", "List your workers", response=items_of(tool_output("bridge_list", "bridge"), "workers"))
@contract("POST", "Spawn a worker", body=SPAWN, response=tool_output("bridge_spawn", "bridge"), status=201)
@api_view(["GET", "POST"])
def members_view(request):
    if request.method == "GET":
        caller = _primary(request, "Read")
        rows = reads.list_workers(caller)
        return ok(rows, count=len(rows))
    caller = _primary(request, "Execute")
    profile = payload(request, SPAWN).get("profile")
    try:
        member = workers.spawn(caller, profile, primary_pane=_pane_hint(request), cid=cid_of(request))
    except BridgeFailure as exc:
        raise exc.as_yuzu_error() from None
    return ok(member.to_dict(), status=201)


@contract("DELETE", "Stop a worker (idempotent)", response=tool_output("bridge_stop", "bridge"))
@api_view(["DELETE"])
def member_detail(request, pane_id):
    caller = _primary(request, "Execute")
    try:
        return ok(workers.stop(caller, pane_id, primary_pane=_pane_hint(request), cid=cid_of(request)))
    except BridgeFailure as exc:
        raise exc.as_yuzu_error() from None


@contract("POST", "Hook sink: a worker's lifecycle hook events (the worker's own token)", body=HOOK,
          response=obj({}, additional=True))
@api_view(["POST"])
@authentication_classes([WorkerTokenAuthentication])
def member_events(request, pane_id):
    data = payload(request, HOOK)
    try:
        return ok(workers.hook_event(principal_of(request), pane_id, data))
    except BridgeFailure as exc:
        raise exc.as_yuzu_error() from None
