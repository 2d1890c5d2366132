"""Plugin configuration and kill switches on the agent (docs/operator.md, docs/agent-protocol.md).

The server pushes ``plugin.config`` (one plugin's whole configuration) and ``plugin.kill`` (the kill
switches that reach this agent) on connect and whenever they change. The configuration is applied at once — plugins read it from
``ctx.config["plugin_config"][plugin]`` on their next run, no restart — and a switched-off plugin or action
is refused locally (REJECTED, ``kill_switched``) even if a command reaches the agent, and its running
commands are asked to stop. The agent acknowledges each change with a ``plugin_state`` report. Secrets are
never delivered (spec decision)."""

import hashlib
import json
import logging
import threading

log = logging.getLogger("yuzu.agent")
MAX_PLUGINS = 256
MAX_KEYS = 512


def digest(values):
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


class PluginControl:
    def __init__(self):
        self.config = {}  # plugin -> {key: value}
        self.switches = {}  # "plugin" or "plugin.action" -> reason, for those switched OFF
        self.stops = {}  # plugin -> threading.Event set while that plugin is switched off
        self.lock = threading.Lock()

    def apply_config(self, msg):
        plugin, values = msg.get("plugin"), msg.get("config")
        if not isinstance(plugin, str) or not isinstance(values, dict) or len(values) > MAX_KEYS or \
                not all(isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
            log.warning("ignoring a malformed plugin.config frame")
            return None
        with self.lock:
            if values:
                self.config[plugin] = dict(values)
            else:
                self.config.pop(plugin, None)
            if len(self.config) > MAX_PLUGINS:
                return None
        log.info("plugin %s configuration applied (%d keys)", plugin, len(values))
        return self.report()

    def apply_kill(self, msg):
        rows = msg.get("switches")
        if not isinstance(rows, list):
            log.warning("ignoring a malformed plugin.kill frame")
            return None
        off = {}
        for row in rows[:4096]:
            if not isinstance(row, dict) or not isinstance(row.get("plugin"), str):
                continue
            key = f"{row['plugin']}.{row['action']}" if row.get("action") else row["plugin"]
            if row.get("enabled") is False:
                off[key] = str(row.get("reason") or "")
            else:
                off.pop(key, None)
                off[key + "\0on"] = ""  # an explicit 'on' row for an action overrides its plugin's 'off'
        with self.lock:
            self.switches = off
            for plugin in {k.split(".", 1)[0] for k in off if not k.endswith("\0on")}:
                self.stops.setdefault(plugin, threading.Event()).set()
            for plugin, event in self.stops.items():
                if plugin not in off:
                    event.clear()
        if any(not k.endswith("\0on") for k in off):
            log.warning("kill switches now off: %s", ", ".join(k for k in off if not k.endswith("\0on")))
        return self.report()

    def refusal(self, plugin, action):
        """None when the plugin action may run; otherwise why not (the action's switch wins)."""
        with self.lock:
            name = f"{plugin}.{action}"
            if name + "\0on" in self.switches:
                return None
            for key in (name, plugin):
                if key in self.switches:
                    reason = self.switches[key]
                    return f"kill_switched: {key} is switched off" + (f": {reason}" if reason else "")
        return None

    def stop_event(self, plugin):
        with self.lock:
            return self.stops.setdefault(plugin, threading.Event())

    def snapshot(self):
        with self.lock:
            return {p: dict(v) for p, v in self.config.items()}

    def report(self):
        with self.lock:
            applied = {p: digest(v) for p, v in self.config.items()}
            off = sorted(k for k in self.switches if not k.endswith("\0on"))
        return {"type": "report", "kind": "plugin_state", "report": {"config": applied, "switched_off": off}}
