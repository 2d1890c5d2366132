"""The daily software-inventory and licence sync (spec/operator.md §4): the first run shortly after
connect (jittered), then every 24 h at a stable per-agent offset. When the package list has not changed
since the last full list (and that list is less than a week old) only its content hash is sent; the server
answers ``software.resync`` when it cannot match the hash, and the next run sends everything. A full list
goes in pages (``page``/``pages``) that each fit one WebSocket frame."""

import asyncio
import hashlib
import json
import logging
import random
import time

from . import software, write_private

log = logging.getLogger("yuzu.agent")
DAY_S = 86400
WEEK_S = 7 * DAY_S
PAGE_BYTES = 600 * 1024
LICENSE_BYTES = 800 * 1024


def pages(rows, limit=PAGE_BYTES):
    page, size = [], 0
    for row in rows:
        n = len(json.dumps(row)) + 1
        if page and size + n > limit:
            yield page
            page, size = [], 0
        page.append(row)
        size += n
    yield page


class InventorySync:
    def __init__(self, send, state_path, agent_key, config):
        self.send, self.state_path, self.config = send, state_path, config
        self.offset = int(hashlib.sha256(agent_key.encode()).hexdigest()[:8], 16) % DAY_S  # stable per agent
        self.force_full = False
        self.wake = None

    def _state(self):
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, state):
        # Owner-only like the agent's other state: under var/agent/ a 0644 file is what serve's start-up check
        # (yuzu.W001) reports on a fresh install.
        write_private(self.state_path, json.dumps(state).encode())

    def resync(self):
        """The server could not match our hash: send the full list now."""
        self.force_full = True
        if self.wake is not None:
            self.wake.set()

    async def run(self, pool):
        loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()
        first = float(self.config.get("inventory_first_delay_s", random.uniform(5, 30)))
        delay = first
        while True:
            try:
                await asyncio.wait_for(self.wake.wait(), delay)
            except TimeoutError:
                pass
            self.wake.clear()
            try:
                rows = await loop.run_in_executor(pool, software.installed_software)
                await self.report(rows, pool)
            except Exception:  # a failed scan must not end the connection
                log.exception("software inventory sync failed")
            interval = float(self.config.get("inventory_interval_s", DAY_S))
            delay = interval if interval != DAY_S else DAY_S - (time.time() - self.offset) % DAY_S

    async def report(self, rows, pool):
        digest = software.content_hash(rows)
        state = self._state()
        fresh = state.get("hash") == digest and time.time() - state.get("full_at", 0) < WEEK_S
        if fresh and not self.force_full:
            await self.send({"type": "report", "kind": "software", "report": {"hash": digest}})
            return
        chunks = list(pages(rows))
        for i, chunk in enumerate(chunks):
            await self.send({"type": "report", "kind": "software",
                             "report": {"hash": digest, "page": i, "pages": len(chunks), "packages": chunk}})
        loop = asyncio.get_running_loop()
        licences = await loop.run_in_executor(pool, software.detected_licenses, rows)
        while licences and len(json.dumps(licences)) > LICENSE_BYTES:
            licences = licences[: len(licences) * 3 // 4]
        await self.send({"type": "report", "kind": "licenses", "report": {"licenses": licences}})
        self.force_full = False
        self._save({"hash": digest, "full_at": time.time()})
        log.info("software inventory sent: %d packages, %d licences", len(rows), len(licences))
