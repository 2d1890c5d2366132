"""The Injector + StatusPoller (spec §5): one loop over the live workers on this bridge's tmux socket.

Per worker and tick:

1. **Status**, most trusted first: pane dead or absent → GONE; a recent lifecycle-hook status (newer
   than the last delivery) → it; the pane title (spinner → WORKING, ✳ → IDLE); the screen rules of
   bridge/screen_rules.json; nothing → UNKNOWN.
2. **GONE** fails the queue: queued messages fail, open turns end ``gone``, waiters get worker_gone.
3. **Pickup**: a delivered message counts as picked up when the worker shows WORKING, when its turn
   already ended (a reply faster than a tick), or after PICKUP_GRACE_POLLS polls (a turn that
   finished between two samples).
4. **Turn-done fallback**: a picked-up turn whose worker is IDLE again (or BLOCKED, when the profile
   lets the primary answer dialogs) without a bridge_reply resolves with ``turn_done`` and the tail
   of the terminal.
5. **Injection**: IDLE (or BLOCKED if the profile's ``blocked_injectable``) with no message awaiting
   pickup and no open turn → paste the head of the FIFO as one bracketed paste plus Enter. At most
   one message per turn. A paste the backend refuses drops that message with an error to its sender.
   WORKING and UNKNOWN never get text.

Plus a sweep (every 2 s) that moves an outcome stranded on a dead waiter into the primary's inbox, hands a rotated
primary's workers to its live successor, and stops the workers nobody can reach any more: those of a primary that is
gone (bridge.workers.stop_orphans) and those whose own token ended (bridge.workers.stop_expired); and, hourly, the
history past YUZU_BRIDGE_HISTORY_DAYS is deleted (bridge.workers.reap_history).
"""

import logging
import signal
import threading
import time
from datetime import timedelta

from django.db import close_old_connections, connections
from django.utils import timezone

from . import conf
from .models import Member, Message, Turn
from .status import AgentStatus, load_rules
from .terminal import PaneNotFound, TerminalError
from .turns import sweep
from .workers import backend, observe, reap_history, stop_expired, stop_orphans, terminate

log = logging.getLogger("yuzu.bridge.poller")
REAP_EVERY_S = 3600.0  # the history past YUZU_BRIDGE_HISTORY_DAYS is deleted at start and then hourly


class StatusPoller:
    def __init__(self, socket_name=None, interval=None, grace_polls=None, rules=None):
        self.socket_name = socket_name or conf.socket_name()
        self.backend = backend(self.socket_name)
        self.interval = interval if interval is not None else conf.poll_interval()
        self.grace_polls = grace_polls if grace_polls is not None else conf.pickup_grace_polls()
        self.rules = rules if rules is not None else load_rules()
        self.waiting_polls = {}  # session_id → polls since the in-flight message was delivered
        self.stop_event = threading.Event()
        self._last_sweep = 0.0
        self._last_reap: float | None = None

    # -- loop --------------------------------------------------------------------------------

    def run_forever(self):
        log.info("bridge poller on tmux socket %r every %.2fs", self.socket_name, self.interval)
        while not self.stop_event.is_set():
            started = time.monotonic()
            close_old_connections()
            if self.paused():
                self.stop_event.wait(0.05)
                continue
            try:
                self.tick()
            except Exception:
                log.exception("bridge poller tick failed")
            self.stop_event.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def stop(self):
        self.stop_event.set()

    @staticmethod
    def paused():
        """While the file YUZU_BRIDGE_PAUSE_FILE exists the poller holds no connection and does nothing, and
        says so by creating <file>.ack (maintenance windows; the tests pause it before flushing the database)."""
        path = conf.pause_file()
        if path is None or not path.exists():
            return False
        connections.close_all()
        path.with_name(path.name + ".ack").touch()
        return True

    def tick(self):
        members = list(Member.objects.select_related("profile", "current_turn")
                       .filter(stopped_at__isnull=True, socket_name=self.socket_name).exclude(pane_id=""))
        live = set()
        for m in members:
            live.add(m.session_id)
            try:
                self.step(m)
            except Exception:
                log.exception("bridge poller: worker %s", m.session_id)
        for sid in set(self.waiting_polls) - live:
            self.waiting_polls.pop(sid, None)
        if time.monotonic() - self._last_sweep > 2.0:
            self._last_sweep = time.monotonic()
            sweep()
            stop_orphans(self.socket_name)
            stop_expired(self.socket_name)
            # A spawn that never got its pane (its server process died mid-spawn) is not a worker.
            stale = timezone.now() - timedelta(seconds=60)
            for m in Member.objects.filter(stopped_at__isnull=True, socket_name=self.socket_name, pane_id="",
                                           created_at__lt=stale):
                terminate(m, "its spawn never completed", close=False)
        if self._last_reap is None or time.monotonic() - self._last_reap > REAP_EVERY_S:
            self._last_reap = time.monotonic()
            reaped = reap_history()
            if reaped:
                log.info("bridge history past %d days deleted: %s", conf.history_days(),
                         ", ".join(f"{n} {name}" for name, n in sorted(reaped.items())))

    # -- one worker ----------------------------------------------------------------------------

    def step(self, m):
        try:
            st, source, _ = observe(m, self.backend, self.rules)
        except PaneNotFound:
            st, source = AgentStatus.GONE, Member.Source.PANE
        except TerminalError as exc:
            # A pane killed under us can answer oddly ("no current target"); ask the server which
            # panes exist before calling it a hiccup.
            try:
                gone = (m.pane_id, m.terminal_id) not in {(p.pane_id, p.terminal_id) for p in self.backend.list_panes()}
            except TerminalError:
                gone = False
            if not gone:  # a tmux hiccup: say nothing this tick
                log.warning("observing %s: %s", m.session_id, exc)
                return
            st, source = AgentStatus.GONE, Member.Source.PANE
        if st is AgentStatus.GONE:
            self.waiting_polls.pop(m.session_id, None)
            terminate(m, "its pane exited", close=True)
            log.info("worker %s is gone", m.session_id)
            return
        m.set_status(st, source)
        profile = m.profile
        blocked_ok = profile.blocked_injectable if profile is not None else True

        inflight = m.messages.select_related("turn").filter(state=Message.State.DELIVERED).order_by("id").first()
        if inflight is not None:
            turn_over = inflight.turn is None or not inflight.turn.active
            if st.counts_as_pickup or turn_over:
                inflight.mark_picked_up("working" if st.counts_as_pickup else "turn ended")
                self.waiting_polls.pop(m.session_id, None)
            else:
                n = self.waiting_polls[m.session_id] = self.waiting_polls.get(m.session_id, 0) + 1
                if n >= self.grace_polls and st in (AgentStatus.IDLE, AgentStatus.BLOCKED):
                    inflight.mark_picked_up(f"grace after {n} polls")
                    self.waiting_polls.pop(m.session_id, None)
                else:
                    return  # at most one message per turn: wait for the pickup

        turn = Turn.objects.filter(pk=m.current_turn_id).first() if m.current_turn_id else None
        if turn is not None and turn.active:
            delegated = turn.messages.exists()  # else a worker's own ask
            picked = turn.messages.filter(state=Message.State.PICKED_UP).exists()
            ended = st is AgentStatus.IDLE or (st is AgentStatus.BLOCKED and blocked_ok)
            if ended and (picked or not delegated):
                try:
                    tail = self.backend.read_tail(m.pane, conf.tail_lines())
                except TerminalError as exc:
                    tail = f"(terminal unreadable: {exc})"
                if turn.resolve_turn_done(tail, notify=delegated):
                    log.info("turn %s of %s: turn_done fallback", turn.turn_id, m.session_id)
                return  # deliver the next message on a later tick, from a fresh status
            return  # a turn is open: nothing new goes in

        injectable = st is AgentStatus.IDLE or (st is AgentStatus.BLOCKED and blocked_ok)
        if not injectable:
            return
        head = m.messages.filter(state=Message.State.QUEUED).order_by("id").first()
        if head is None or not head.claim():
            return
        try:
            self.backend.paste(m.pane, head.content)
        except PaneNotFound:
            head.fail_delivery("the worker's pane is gone")
            terminate(m, "its pane vanished during a delivery")
            return
        except TerminalError as exc:
            log.warning("delivery to %s failed: %s", m.session_id, exc)
            head.fail_delivery(exc)
            return
        self.waiting_polls[m.session_id] = 0
        log.info("delivered message %s (turn %s) to %s", head.pk, head.turn_id, m.session_id)


def run(socket_name=None, interval=None):
    poller = StatusPoller(socket_name=socket_name, interval=interval)

    def on_signal(signum, frame):
        poller.stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(sig, on_signal)
        except ValueError:  # not the main thread
            pass
    poller.run_forever()
    return poller
