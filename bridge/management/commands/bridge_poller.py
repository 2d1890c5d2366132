"""Run the bridge's Injector + StatusPoller in the foreground (`make run` starts it via `serve`)."""

from django.core.management.base import BaseCommand

from bridge import conf
from bridge.poller import run


class Command(BaseCommand):
    help = "Run the bridge's StatusPoller/Injector loop over the workers on this bridge's tmux socket."

    def add_arguments(self, parser):
        parser.add_argument("--socket", default=None, help="tmux socket name (default $YUZU_BRIDGE_TMUX_SOCKET or "
                                                           "yuzu-bridge)")
        parser.add_argument("--interval", type=float, default=None,
                            help="seconds between polls (default $YUZU_BRIDGE_POLL_INTERVAL or 0.4)")

    def handle(self, *args, socket, interval, **opts):
        self.stdout.write(f"bridge poller: tmux socket {socket or conf.socket_name()!r}, "
                          f"interval {interval or conf.poll_interval():.2f}s; Ctrl-C stops it.")
        run(socket_name=socket, interval=interval)
