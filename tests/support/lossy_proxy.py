"""A TCP relay between agents and daphne that can lose what an agent sends, then cut its connections: the
loss window of a dying connection, made on purpose with real sockets and real processes.

``swallow()``: from now on, bytes from the agents are read and dropped (counted in ``swallowed``) while the
server's bytes still reach them. The agent's WebSocket writes succeed — to the agent, a frame sent is a frame
sent — but the server never gets them: what a connection whose server end had died (a Redis outage closing
the consumer, a NAT dropping state) does to frames in flight. ``cut()`` then aborts every open connection
(both ends see a reset) and relays new ones normally again, so the agent reconnects through the relay."""

import asyncio
import threading


class LossyProxy:
    def __init__(self, upstream_port, upstream_host="127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self.port = None
        self.swallowing = False
        self.swallowed = 0  # bytes from agents dropped while swallowing
        self._pairs = set()
        self._loop = None
        self._thread = None

    async def _pump(self, reader, writer, from_agent):
        try:
            while data := await reader.read(65536):
                if from_agent and self.swallowing:
                    self.swallowed += len(data)
                    continue
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _client(self, creader, cwriter):
        try:
            ureader, uwriter = await asyncio.open_connection(*self.upstream)
        except OSError:
            cwriter.close()
            return
        pair = (cwriter, uwriter)
        self._pairs.add(pair)
        try:
            await asyncio.gather(self._pump(creader, uwriter, True), self._pump(ureader, cwriter, False))
        finally:
            self._pairs.discard(pair)

    def swallow(self):
        self._call(lambda: setattr(self, "swallowing", True))

    def cut(self):
        """Abort every open connection; connections made after this are relayed in full."""
        def cut():
            self.swallowing = False
            for pair in list(self._pairs):
                for writer in pair:
                    writer.transport.abort()
        self._call(cut)

    def _call(self, fn):
        done = threading.Event()
        self._loop.call_soon_threadsafe(lambda: (fn(), done.set()))
        done.wait(10)

    def start(self):
        ready = threading.Event()

        def run():
            self._loop = asyncio.new_event_loop()
            server = self._loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()
            server.close()
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            if tasks:
                self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

        self._thread = threading.Thread(target=run, daemon=True, name="lossy-proxy")
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self):
        if self._loop is not None:
            self.cut()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
