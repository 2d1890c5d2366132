"""One call of a function for many agent connections: what the connections of a server process hand in while a
call runs queues up and goes in the next one. Every database call of a process's agent sockets runs on its one
database thread (``database_sync_to_async``), so 5,000 agents' response frames or heartbeats, one hop each, queue
behind one another, and behind them everything else the sockets need (a register, a command's answer); a hop per
batch keeps that thread free whatever the fleet's size.

``Batcher(apply)``: ``await batcher.submit(item)`` returns ``item``'s result once its batch has run. ``apply`` is
an async function from a list of items to a list of their results, in order. A lone item goes at once; a batch
that fails is run again item by item, so one bad item fails only its own caller."""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

log = logging.getLogger("yuzu.fleet")

Item = TypeVar("Item")
Result = TypeVar("Result")
MAX_BATCH = 1000


class Batcher(Generic[Item, Result]):
    def __init__(self, apply: Callable[[list[Item]], Awaitable[Sequence[Result]]], what: str,
                 max_batch: int = MAX_BATCH) -> None:
        self.apply, self.what, self.max_batch = apply, what, max_batch
        self.loop: asyncio.AbstractEventLoop | None = None
        self.queue: list[tuple[Item, asyncio.Future[Result]]] = []
        self.task: asyncio.Task[None] | None = None

    async def submit(self, item: Item) -> Result:
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # a new event loop (tests): nothing queued on the old one survives it
            self.loop, self.queue, self.task = loop, [], None
        done: asyncio.Future[Result] = loop.create_future()
        self.queue.append((item, done))
        if self.task is None:
            self.task = loop.create_task(self.drain())
        return await done

    async def drain(self) -> None:
        try:
            while self.queue:
                batch, self.queue = self.queue[:self.max_batch], self.queue[self.max_batch:]
                try:
                    results = await self.apply([item for item, _ in batch])
                except Exception:
                    log.warning("a batch of %d %s failed; retrying one by one", len(batch), self.what, exc_info=True)
                    for item, done in batch:
                        try:
                            _settle(done, (await self.apply([item]))[0])
                        except Exception as exc:
                            _settle(done, error=exc)
                else:
                    for (_, done), result in zip(batch, results, strict=True):
                        _settle(done, result)
        finally:
            self.task = None


def _settle(future: "asyncio.Future[Any]", result: Any = None, error: Exception | None = None) -> None:
    if not future.done():
        future.set_exception(error) if error is not None else future.set_result(result)
