"""Django's PostgreSQL backend, with the health check of a kept connection made without a round trip.

With ``CONN_HEALTH_CHECKS`` Django checks a reused connection once per request by sending ``SELECT 1``: one
of the five round trips of an MCP call, on every call. A connection the server has closed (a restart, a
terminated backend, an idle timeout) has said so on its socket before it went: PostgreSQL sends its FATAL
message and closes, so the socket reads as ready. So: a kept connection whose socket has nothing to read is
used as it is; one that has something (that close, or a rare asynchronous notice) gets Django's own check.
A peer that vanished without a word (a cut network) is not caught by either until TCP gives up."""

import select

from django.db.backends.postgresql import base


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        conn = self.connection
        if conn is None or conn.closed:
            return False
        try:
            ready, _, _ = select.select([conn.fileno()], [], [], 0)
        except (OSError, ValueError):  # the socket is gone
            return False
        return not ready or super().is_usable()
