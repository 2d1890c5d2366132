"""How yuzu runs daphne: ``python -m yuzu.daphne_main <daphne's arguments>``, daphne's own command line on uvloop.

daphne runs Twisted on an asyncio event loop it makes when ``daphne.server`` is first imported; with uvloop's
policy installed before that, the loop is uvloop's (libuv, in C) instead of asyncio's selector loop (Python).
Twisted's reactor, daphne and Channels run unchanged on it. What it saves is the loop's own work per turn —
polling, timers, the wake-up from the worker threads: 11–14 % of the event loop thread's instructions per
request, 6 % of a whole tools/call (bench/mcp_calls/README.md, eighteenth round). ``serve``, the tests and the
benches start daphne this way, so what is tested is what runs."""

import asyncio

import uvloop

asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # before daphne.server makes Twisted's loop

from daphne.cli import CommandLineInterface  # noqa: E402  (after the policy, as the policy must come first)

if __name__ == "__main__":
    CommandLineInterface.entrypoint()
