"""A local HTTP/1.1 proxy that adds `Authorization: Bearer <token>` to every request it forwards.

For clients that cannot send a token, such as the MCP conformance CLI (pinned 0.1.13 has no header option):
point the client at the proxy and it reaches daphne with a real token, so the server needs no test-only
switch that lets unauthenticated calls in. Every other byte passes through unchanged (Host and Origin
included, so the DNS-rebinding checks still see what the client sent); responses, SSE streams included,
are relayed as they arrive.

By hand (the token from `manage.py mint_token`):

    YUZU_TOKEN=yuzu_… .venv/bin/python -m tests.support.auth_proxy --port 8001 --upstream 127.0.0.1:8000
"""

import argparse
import asyncio
import os
import threading


class AuthProxy:
    def __init__(self, upstream_port, token, upstream_host="127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self.header = f"Authorization: Bearer {token}\r\n".encode()
        self.port = None
        self._loop = None
        self._thread = None

    async def _relay(self, reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _client(self, creader, cwriter):
        ureader, uwriter = await asyncio.open_connection(*self.upstream)
        back = asyncio.ensure_future(self._relay(ureader, cwriter))
        try:
            while True:
                head = await creader.readuntil(b"\r\n\r\n")
                request_line, *lines = head[:-4].split(b"\r\n")
                kept = [line for line in lines if not line.lower().startswith(b"authorization:")]
                length = 0
                for line in kept:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                    elif name.strip().lower() == b"transfer-encoding":
                        raise ValueError("the proxy forwards Content-Length bodies only")
                uwriter.write(b"\r\n".join([request_line, *kept]) + b"\r\n" + self.header + b"\r\n")
                if length:
                    uwriter.write(await creader.readexactly(length))
                await uwriter.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            uwriter.close()
            await back

    def start(self):
        ready = threading.Event()

        def run():
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            server = self._loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", self.port or 0))
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()
            # Stopped: end every relay here, on this loop, then close it. Left pending, they were destroyed later
            # by the garbage collector, logging "Task was destroyed but it is pending!" in whichever test ran then.
            server.close()
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

        self._thread = threading.Thread(target=run, daemon=True, name="auth-proxy")
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self):
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--upstream", default="127.0.0.1:8000", help="host:port of daphne")
    args = parser.parse_args()
    host, _, port = args.upstream.rpartition(":")
    proxy = AuthProxy(int(port), os.environ["YUZU_TOKEN"], host or "127.0.0.1")
    proxy.port = args.port
    proxy.start()
    print(f"forwarding 127.0.0.1:{proxy.port} → {args.upstream} with the token; Ctrl-C stops it")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        proxy.stop()
