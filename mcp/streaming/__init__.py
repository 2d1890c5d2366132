"""Server→client streaming for the MCP transport (docs/streaming.md): the session's GET channel, the streamed
POST, and what both stand on. The transport (mcp.transport) hands a stream its connection and the call's
context; nothing here knows a tool or an app.

    stream.py       the interfaces: Stream (a held-open response) and Connection (the HTTP side); SSE framing
    sessions.py     SessionStore: MCP sessions, in memory or Redis
    ring.py         RingStore: per-session replay rings (event ids, Last-Event-ID), in memory or Redis
    backend.py      which store implementation a process uses (Redis when YUZU_REDIS_URL is set)
    admission.py    who may hold a stream: GET and streamed-POST budgets, progress records, pin slots
    follower.py     a call's progress → notifications/progress frames on the ring, the result last
    watch.py        the per-tick re-validation of a held-open stream's credential and session
    get_stream.py   the GET channel: replay, resume, takeover, heartbeats, close frames
    post_stream.py  the streamed POST response
    wake.py         channel-layer signals to a session's live streams in any process (wake, close, cancel)
    shutdown.py     a stopping daphne process closes its streams with a frame before the sockets drop
    metrics.py      the streaming metric families (docs/metrics.md)
"""
