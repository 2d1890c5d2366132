"""Run the bridge's Injector + StatusPoller in the foreground (`make run` starts it via `serve`)."""

from django.core.management.base import BaseCommand

from bridge import conf
from bridge.poller import run


class Command(BaseCommand):
    help = "Run the bridge's StatusPoller/Injector loop over the workers on this bridge's tmux socket."

    def add_arguments(self, parser):
        parser.add_argument("--socket", default=None, help="tmux socket name (default $YUZU_BRIDGE_TMUX_SOCKET, else "
                                                           "derived from the data directory)")
        parser.add_argument("--interval", type=float, default=None,
                            help="seconds between polls (default $YUZU_BRIDGE_POLL_INTERVAL or 0.4)")
        parser.add_argument("--print-socket", action="store_true",
                            help="print this installation's tmux socket name and exit (for tmux -L)")

    def handle(self, *args, socket, interval, print_socket, **opts):
        sock = socket or conf.socket_name()
        if print_socket:
            self.stdout.write(sock)
            return
        self.stdout.write(f"bridge poller: workers run on the private tmux server {sock!r} "
                          f"(watch them: tmux -L {sock} ls), interval {interval or conf.poll_interval():.2f}s; "
                          "Ctrl-C stops it.")
        run(socket_name=sock, interval=interval)
