"""What a bridge caller may see: its workers, their status and terminals, the profiles, its inbox.

Invariants:

* Nothing here changes state (``InboxItem`` rows are acknowledged by ``turns.ack``, never by reading).
* A caller sees only its own world: a primary its own workers, a worker its own primary's; the inbox
  is per principal. ``bridge_read`` (the terminal) is the primary's only.
* No view carries an environment value or a token: ``Profile.to_dict`` shows ``spawnable``, a boolean.
"""

from django.utils import timezone

from .failures import BridgeFailure
from .identity import PRIMARY, require
from .models import InboxItem, Member, Profile
from .terminal import PaneNotFound, TerminalError
from .workers import backend, observe, resolve_worker


def list_workers(caller):
    now = timezone.now()
    return [m.status_dict(now) for m in Member.objects.live().select_related("current_turn")
            .filter(owner_key=caller.world_key)]


def status(caller, ident=None):
    now = timezone.now()
    if ident:
        m = Member.objects.lookup(caller.world_key, ident)
        if m is None:
            raise BridgeFailure("unknown_worker", f"no worker '{ident}' of yours; bridge_list shows your workers")
        workers = [m.status_dict(now)]
    else:
        workers = list_workers(caller)
    me = {"role": caller.role, "pending": InboxItem.objects.pending(caller.inbox_key).count()}
    if caller.member is not None:
        me["sessionId"] = caller.member.session_id
    return {"workers": workers, "caller": me, "pending": me["pending"]}


def list_profiles():
    d = Profile.objects.default()
    return [p.to_dict(d.pk if d else None) for p in Profile.objects.filter(enabled=True)]


def inbox_items(key, limit=20):
    return [item.to_dict() for item in InboxItem.objects.pending(key)[:limit]]


def read(caller, ident=None, source="recent"):
    require(caller, PRIMARY, "bridge_read")
    m = resolve_worker(caller, ident)
    b = backend(m.socket_name)
    out = {"sessionId": m.session_id, "paneId": m.pane_id, "source": source, "status": m.status}
    try:
        if source == "visible":
            out["text"] = b.read_screen(m.pane)
        elif source == "recent":
            out["text"] = b.read_tail(m.pane, 200)
        elif source == "recent_unwrapped":
            out["text"] = b.read_tail(m.pane, 200, join_wrapped=True)
        else:
            st, src, detail = observe(m, b)
            out["detection"] = {"status": st.value, "source": src, **detail,
                                "hookStatus": m.hook_status or None, "hookEvent": m.hook_event or None,
                                "hookAt": m.hook_at.isoformat() if m.hook_at else None}
            out["text"] = f"{st.value} (from {src})"
    except PaneNotFound:
        raise BridgeFailure("worker_gone", f"worker {m.session_id}'s pane is gone") from None
    except TerminalError as exc:
        raise BridgeFailure("terminal_error", f"reading the pane failed: {exc}", retryable=True, status=502) from None
    return out
