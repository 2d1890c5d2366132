"""Guardian on the agent: the guard rules the server pushed (``guardian.rules``), each watched by polling —
files every 2 s (a changed file is re-read after its settle window before it counts), services every 5 s
(``systemctl is-active``) — and reported to the server as ``report`` frames of kind ``guardian`` on a state
change: drift.detected, drift.remediated / remediation.failed, guard.healthy, guard.unhealthy.

Enforcement is double-gated: a rule's own ``enforcement_mode`` must be ``enforce`` with an ``enforce``
remediation, AND this agent's operator must have set ``guardian_enforce: true`` in its config (as for
quarantine). Only service guards enforce on Linux (``systemctl start|stop``); file guards alert only.
Registry guards are Windows-only: reported unhealthy with reason ``unsupported_on_platform``."""

import asyncio
import hashlib
import logging
import os
import shutil
import subprocess
import time

log = logging.getLogger("yuzu.agent.guardian")
FILE_POLL_S = 2.0
SERVICE_POLL_S = 5.0
HASH_CHUNK = 1024 * 1024


def file_state(params, baseline=None):
    """(ok, detected, expected) of a file-exists or file-hash-equals assertion."""
    path = params["path"]
    if "expected_hash" in params or baseline is not None:
        expected = (params.get("expected_hash") or baseline or "").lower()
        detected = sha256(path, int(params.get("max_bytes", 67108864)))
        return detected == expected, detected or "absent", expected
    expected = params.get("expected", "present")
    detected = "present" if os.path.exists(path) else "absent"
    return detected == expected, detected, expected


def sha256(path, max_bytes):
    h, n = hashlib.sha256(), 0
    try:
        with open(path, "rb") as f:
            while n < max_bytes and (chunk := f.read(min(HASH_CHUNK, max_bytes - n))):
                h.update(chunk)
                n += len(chunk)
    except OSError:
        return ""
    return h.hexdigest()


def systemd():
    return bool(shutil.which("systemctl")) and os.path.isdir("/run/systemd/system")


def service_state(params, running):
    name = params["service_name"]
    proc = subprocess.run(["systemctl", "is-active", "--", name], capture_output=True, text=True, timeout=30)
    detected = proc.stdout.strip() or "unknown"
    return (detected == "active") == running, detected, "active" if running else "inactive"


class Guard:
    def __init__(self, rule):
        self.rule = rule
        spec = rule["spec"]
        self.assertion = spec["assertion"]["type"]
        self.params = spec["assertion"].get("params") or {}
        self.remediation = spec["remediation"]["type"]
        self.category = "registry" if self.assertion.startswith("registry") else \
            "service" if self.assertion.startswith("service") else "file"
        self.interval = SERVICE_POLL_S if self.category == "service" else FILE_POLL_S
        self.ok = None  # unknown until the first poll
        self.baseline = None
        self.last_ok_at = time.monotonic()


class Guardian:
    def __init__(self, send, config):
        self.send = send  # async send(frame)
        self.config = config
        self.guards = {}
        self.task = None

    @property
    def may_enforce(self):
        return bool(self.config.get("guardian_enforce"))

    def apply(self, rules, full_sync=True):
        """Arm the pushed rule set (a full sync replaces every guard; otherwise rules are added or replaced)."""
        if full_sync:
            self.guards = {}
        for rule in rules:
            try:
                self.guards[rule["rule_id"]] = Guard(rule)
            except (KeyError, TypeError):
                log.warning("ignoring a malformed guard rule %r", rule.get("rule_id") if isinstance(rule, dict) else rule)
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self.run())
        log.info("guardian: %d guard(s) armed", len(self.guards))

    async def run(self):
        poll = float(self.config.get("guardian_poll_s") or 0)
        due = {}
        while True:
            now = time.monotonic()
            for rule_id, guard in list(self.guards.items()):
                if now >= due.get(rule_id, 0):
                    due[rule_id] = now + (poll or guard.interval)
                    try:
                        await self.check(guard)
                    except Exception as exc:  # a guard's fault is its own: reported, never the agent's
                        await self.report(guard, "guard.unhealthy", detail={"reason": f"{type(exc).__name__}: {exc}"})
            await asyncio.sleep(min(poll or FILE_POLL_S, FILE_POLL_S) / 4)

    async def check(self, guard):
        loop = asyncio.get_running_loop()
        if guard.category == "registry":
            if guard.ok is None:
                guard.ok = False
                await self.report(guard, "guard.unhealthy", detail={"reason": "unsupported_on_platform"})
            return
        if guard.category == "service":
            if not systemd():
                if guard.ok is None:
                    guard.ok = False
                    await self.report(guard, "guard.unhealthy", detail={"reason": "systemd is not the init system"})
                return
            ok, detected, expected = await loop.run_in_executor(
                None, service_state, guard.params, guard.assertion == "service-running")
        else:
            if guard.assertion == "file-hash-equals" and not guard.params.get("expected_hash") and guard.baseline is None:
                guard.baseline = await loop.run_in_executor(None, sha256, guard.params["path"],
                                                            int(guard.params.get("max_bytes", 67108864)))
            ok, detected, expected = await loop.run_in_executor(None, file_state, guard.params, guard.baseline)
            if not ok and guard.ok and guard.assertion == "file-hash-equals":
                await asyncio.sleep(int(guard.params.get("settle_ms", 750)) / 1000)  # let a writer finish
                ok, detected, expected = await loop.run_in_executor(None, file_state, guard.params, guard.baseline)
        if ok == guard.ok:
            if ok:
                guard.last_ok_at = time.monotonic()
            return
        first, guard.ok = guard.ok is None, ok
        if ok:
            guard.last_ok_at = time.monotonic()
            if not first:
                await self.report(guard, "guard.healthy", detected, expected)
            return
        latency = int((time.monotonic() - guard.last_ok_at) * 1e6)
        await self.report(guard, "drift.detected", detected, expected, latency=latency)
        if guard.rule.get("enforcement_mode") == "enforce" and guard.remediation == "enforce":
            await self.enforce(guard, detected, expected)

    async def enforce(self, guard, detected, expected):
        if not self.may_enforce or guard.category != "service":
            why = "the agent's operator has not enabled guardian_enforce" if not self.may_enforce \
                else "file guards are alert-only on Linux"
            await self.report(guard, "remediation.failed", detected, expected, action="none", detail={"reason": why})
            return
        verb = "start" if guard.assertion == "service-running" else "stop"
        started = time.monotonic()
        proc = await asyncio.get_running_loop().run_in_executor(None, lambda: subprocess.run(
            ["systemctl", verb, "--", guard.params["service_name"]], capture_output=True, text=True, timeout=60))
        ok = proc.returncode == 0
        await self.report(guard, "drift.remediated" if ok else "remediation.failed", detected, expected,
                          action=f"systemctl {verb}", detail={} if ok else {"stderr": proc.stderr[-1000:]},
                          remediation_latency=int((time.monotonic() - started) * 1e6))
        if ok:
            guard.ok = None  # the next poll confirms

    async def report(self, guard, event_type, detected="", expected="", *, latency=None, action="", detail=None,
                     remediation_latency=None):
        frame = {"type": "report", "kind": "guardian", "rule_id": guard.rule["rule_id"], "event_type": event_type,
                 "guard_type": guard.assertion, "guard_category": guard.category,
                 "detected_value": str(detected)[:4096], "expected_value": str(expected)[:4096],
                 "remediation_action": action, "detail": detail or {}}
        if latency is not None:
            frame["detection_latency_us"] = latency
        if remediation_latency is not None:
            frame["remediation_latency_us"] = remediation_latency
        log.info("guardian: %s %s (%s)", event_type, guard.rule.get("name"), detected)
        await self.send(frame, keep=True)
